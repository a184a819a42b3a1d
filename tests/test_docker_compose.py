"""The Docker set-up (docker/) runs the same stack as the private no-Docker one.

No Docker engine is needed: the compose file, the Dockerfile and the dblog config
are parsed and compared with the private set-up's own source of truth,
``airflow_provider_dblog.devenv.servers``. Its server flags are built inside
functions, so they are captured by calling those functions with the process
launching replaced (nothing is started), and compared flag by flag: a setting
added to or changed in servers.py without the same change in compose.yaml (or
the other way round) fails here. The settings that must differ (paths, bind
addresses, ports inside the container, users) are listed below, explicitly.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_dblog.devenv import servers
from airflow_provider_dblog.engine.config import SparkConfig, load_config, parse_config

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKER_CONFIG = DOCKER / "dblog.docker.yaml"
DEMO_CONFIG = REPO / "airflow_provider_dblog" / "devenv" / "demo.yaml"

# service -> port inside its container (the images' defaults)
CONTAINER_PORTS = {"mariadb": 3306, "postgres": 5432, "redis": 6379}
PRIVATE_PORTS = {"mariadb": servers.MARIADB_PORT, "postgres": servers.POSTGRES_PORT, "redis": servers.REDIS_PORT}
# Debian package -> the jar the engine and servers.py name
JDBC_PACKAGES = {"libmariadb-java": servers.MARIADB_JDBC_JAR, "libpostgresql-jdbc-java": servers.POSTGRES_JDBC_JAR}

# Flags of the private servers that are about the host, not about the server's
# behaviour, and so are not (and must not be) in compose.yaml.
MARIADB_HOST_ONLY = {"no-defaults", "user", "datadir", "port", "bind-address", "socket", "pid-file",
                     "log-error", "skip-name-resolve"}
POSTGRES_HOST_ONLY = {"port", "listen_addresses", "unix_socket_directories"}
# fsync=off trades durability for test speed on the private server; the Docker
# set-up keeps PostgreSQL's default (on).
POSTGRES_PRIVATE_ONLY = {"fsync"}
REDIS_HOST_ONLY = {"port", "bind", "daemonize", "dir", "pidfile", "logfile"}


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #

_COMPOSE_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\})")


def interpolate(value, env: dict[str, str] | None = None):
    """Compose's variable interpolation: ``${V}``, ``${V:-d}``, ``${V-d}``, ``$$``."""
    env = env or {}
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1), m.group(2), m.group(3)
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")

    return _COMPOSE_VAR.sub(sub, value)


def mariadb_flags(args: list[str]) -> dict[str, str | None]:
    """``--a-b=c`` / ``--a_b`` -> ``{"a-b": "c", "a-b": None}`` (dashes and underscores alike)."""
    out: dict[str, str | None] = {}
    for a in args:
        assert a.startswith("--"), f"not a --flag: {a!r}"
        name, eq, val = a[2:].partition("=")
        out[name.replace("_", "-")] = val if eq else None
    return out


def dash_pairs(args: list[str]) -> dict[str, str]:
    """``["--k", "v", ...]`` -> ``{"k": "v"}`` (the redis-server command line)."""
    assert len(args) % 2 == 0, args
    out = {}
    for k, v in zip(args[::2], args[1::2]):
        assert k.startswith("--"), f"not a --flag: {k!r} in {args}"
        out[k[2:]] = v
    return out


def dash_c_settings(args: list[str]) -> dict[str, str]:
    """``["-c", "k=v", ...]`` -> ``{"k": "v"}`` (postgres settings)."""
    assert len(args) % 2 == 0, args
    out = {}
    for c, kv in zip(args[::2], args[1::2]):
        assert c == "-c", f"expected -c before {kv!r} in {args}"
        k, eq, v = kv.partition("=")
        assert eq, kv
        out[k] = v
    return out


def as_list(command) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def published_ports(service: dict) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port), short and long syntax."""
    out = {}
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out[int(p["target"])] = (str(p.get("host_ip", "")), int(p["published"]))
            continue
        parts = str(p).split(":")
        ip = parts[0] if len(parts) == 3 else ""
        host, container = parts[-2], parts[-1].split("/")[0]
        out[int(container)] = (ip, int(host))
    return out


def service_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def volume_mounts(service: dict) -> dict[str, str]:
    """container path -> source (named volume or host path), short syntax."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out[v["target"]] = v.get("source", "")
            continue
        parts = str(v).split(":")
        out[parts[1]] = parts[0]
    return out


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    out = []
    for line in logical:
        instr, _, args = line.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def dockerfile_env(instrs: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for instr, args in instrs:
        if instr == "ENV":
            for tok in shlex.split(args):
                k, eq, v = tok.partition("=")
                if eq:
                    env[k] = v
    return env


# --------------------------------------------------------------------------- #
# The private set-up, read from servers.py itself
# --------------------------------------------------------------------------- #

@pytest.fixture
def private_mariadb() -> dict[str, str | None]:
    return mariadb_flags(list(servers.MARIADB_SETTINGS))


@pytest.fixture
def private_postgres() -> dict[str, str]:
    return dash_c_settings([arg for setting in servers.POSTGRES_SETTINGS for arg in ("-c", setting)])


@pytest.fixture
def private_redis() -> dict[str, str]:
    return dash_pairs(list(servers.REDIS_SETTINGS))


# --------------------------------------------------------------------------- #
# The Docker side
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def compose_text() -> str:
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def compose(compose_text) -> dict:
    doc = yaml.safe_load(compose_text)
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "compose.yaml has no services"
    return doc


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def airflow_env(services) -> dict[str, str]:
    """The airflow service's environment with compose's defaults filled in."""
    return interpolate(service_env(services["airflow"]))


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


@pytest.fixture
def docker_config(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DBLOG_"):
            monkeypatch.delenv(name)
    return load_config(DOCKER_CONFIG)


@pytest.fixture
def demo_config(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DBLOG_"):
            monkeypatch.delenv(name)
    return load_config(DEMO_CONFIG)


def test_services_and_images(services):
    assert set(services) >= {"mariadb", "postgres", "redis", "airflow"}
    assert services["mariadb"]["image"] == "mariadb:10.11"
    assert services["redis"]["image"] == "redis:7"
    # the private PostgreSQL's major version is in its binary path (/usr/lib/postgresql/15/bin)
    assert servers.PG_BIN.parent.name == "15"
    assert services["postgres"]["image"] == f"postgres:{servers.PG_BIN.parent.name}"


# --------------------------------------------------------------------------- #
# Server settings = the private set-up's
# --------------------------------------------------------------------------- #

def test_mariadb_flags_match_private(services, private_mariadb):
    cmd = as_list(services["mariadb"]["command"])
    if cmd and cmd[0] in ("mariadbd", "mysqld"):
        cmd = cmd[1:]
    docker = mariadb_flags(cmd)
    private = {k: v for k, v in private_mariadb.items() if k not in MARIADB_HOST_ONLY}
    # --log-bin is where the private server keeps its files; here it must simply be on
    assert docker.pop("log-bin"), "the binlog must be on"
    assert docker == private


def test_mariadb_cdc_settings(services):
    flags = mariadb_flags([a for a in as_list(services["mariadb"]["command"]) if a.startswith("--")])
    assert flags.get("log-bin"), "the binlog must be on"
    assert flags.get("binlog-format") == "ROW"
    assert flags.get("binlog-row-image") == "FULL"
    assert flags.get("binlog-row-metadata") == "FULL"
    assert int(flags.get("server-id") or 0) >= 1
    assert flags.get("default-time-zone") == "+00:00"
    assert flags.get("character-set-server") == "utf8mb4"


def test_postgres_settings_match_private(services, private_postgres):
    cmd = as_list(services["postgres"]["command"])
    if cmd and cmd[0] == "postgres":
        cmd = cmd[1:]
    docker = dash_c_settings(cmd)
    private = {k: v for k, v in private_postgres.items() if k not in POSTGRES_HOST_ONLY | POSTGRES_PRIVATE_ONLY}
    assert docker == private
    assert docker["wal_level"] == "logical"
    assert int(docker["max_replication_slots"]) >= 1 and int(docker["max_wal_senders"]) >= 1
    assert docker["timezone"] == "UTC"
    assert private_postgres.get("fsync") == "off" and "fsync" not in docker


def test_redis_settings_match_private(services, private_redis):
    cmd = as_list(services["redis"]["command"])
    assert cmd[0] == "redis-server", cmd
    docker = dash_pairs(cmd[1:])
    private = {k: v for k, v in private_redis.items() if k not in REDIS_HOST_ONLY}
    assert docker == private
    assert docker["appendonly"] == "yes"
    assert docker["appendfsync"] == "everysec"


def test_host_ports_are_the_private_ports(services):
    assert PRIVATE_PORTS == {"mariadb": 13306, "postgres": 15432, "redis": 16379}
    for name, container_port in CONTAINER_PORTS.items():
        ports = published_ports(services[name])
        assert set(ports) == {container_port}, f"{name}: {services[name].get('ports')}"
        ip, host_port = ports[container_port]
        assert host_port == PRIVATE_PORTS[name], f"{name}: host port {host_port}"
        # like the private servers: reachable from this machine only
        assert ip == servers.HOST, f"{name}: published on {ip or 'all interfaces'}"
    assert {p for _, p in published_ports(services["airflow"]).values()} == {8080}
    assert 8080 in published_ports(services["airflow"])


def test_servers_have_healthchecks_and_volumes(compose, services):
    data_dirs = {"mariadb": "/var/lib/mysql", "postgres": "/var/lib/postgresql/data", "redis": "/data"}
    named = set(compose.get("volumes") or {})
    for name, data_dir in data_dirs.items():
        hc = services[name].get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{name}: no healthcheck"
        source = volume_mounts(services[name]).get(data_dir)
        assert source in named, f"{name}: {data_dir} is not on a named volume ({source!r})"


def test_server_credentials(services, compose_text):
    maria = service_env(services["mariadb"])
    assert maria.get("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD") or maria.get("MARIADB_ROOT_PASSWORD", "").startswith("${")
    pg = service_env(services["postgres"])
    assert pg.get("POSTGRES_HOST_AUTH_METHOD") == "trust" or pg.get("POSTGRES_PASSWORD", "").startswith("${")
    if pg.get("POSTGRES_HOST_AUTH_METHOD") == "trust":
        lines = compose_text.splitlines()
        at = next(i for i, line in enumerate(lines) if "POSTGRES_HOST_AUTH_METHOD" in line)
        before = "\n".join(lines[max(0, at - 4):at]).lower()
        assert "dev" in before and "only" in before, "trust authentication needs a 'development only' comment"


def test_postgres_init_creates_target_and_airflow_databases(services, airflow_env, docker_config):
    init_dir = DOCKER / "postgres-init"
    mounts = volume_mounts(services["postgres"])
    assert (COMPOSE_FILE.parent / mounts["/docker-entrypoint-initdb.d"]).resolve() == init_dir.resolve()
    sql = " ".join(p.read_text() for p in sorted(init_dir.glob("*.sql")))
    created = set(re.findall(r"CREATE\s+DATABASE\s+\"?(\w+)\"?", sql, re.I))
    assert {t.endpoint.database for t in docker_config.targets.values() if t.endpoint} <= created
    assert {s.endpoint.database for s in docker_config.sources.values() if s.kind == "postgres"} <= created
    url = airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    m = re.fullmatch(r"postgresql(\+\w+)?://([^:@/]+)(:[^@]*)?@([^:/]+):(\d+)/(\w+)", url)
    assert m, url
    assert (m.group(4), int(m.group(5))) == ("postgres", CONTAINER_PORTS["postgres"])
    assert m.group(6) in created


# --------------------------------------------------------------------------- #
# The airflow service
# --------------------------------------------------------------------------- #

def test_airflow_service_build_and_start(services, dockerfile):
    af = services["airflow"]
    build = af["build"]
    context = (COMPOSE_FILE.parent / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    cmd = af.get("command") or next(json.loads(a) for i, a in dockerfile if i == "CMD")
    assert as_list(cmd) == ["airflow", "standalone"]
    deps = af["depends_on"]
    assert set(deps) == {"mariadb", "postgres", "redis"}
    assert all(d.get("condition") == "service_healthy" for d in deps.values()), deps


def test_airflow_environment(services, airflow_env, dockerfile):
    env = {**dockerfile_env(dockerfile), **airflow_env}
    assert env["DBLOG_CONFIG"] == "/opt/dblog/docker/dblog.docker.yaml"
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["TZ"] == "UTC"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"
    assert env["AIRFLOW_HOME"] == "/opt/airflow"
    # the DAGs folder is the repo's dags/ (mounted, and copied into the image)
    mounts = volume_mounts(services["airflow"])
    dags = env["AIRFLOW__CORE__DAGS_FOLDER"]
    assert dags == "/opt/dblog/dags"
    assert (COMPOSE_FILE.parent / mounts[dags]).resolve() == REPO / "dags"
    # DBLOG_CONFIG is this repo's docker/dblog.docker.yaml
    assert (COMPOSE_FILE.parent / mounts[env["DBLOG_CONFIG"]]).resolve() == DOCKER_CONFIG
    # the event log (storage.root) is on a named volume
    assert mounts.get("/data/dblog") in set(yaml.safe_load(COMPOSE_FILE.read_text())["volumes"])


def _conn(airflow_env, conn_id: str) -> dict:
    raw = airflow_env[f"AIRFLOW_CONN_{conn_id.upper()}"]
    assert raw.lstrip().startswith("{"), f"{conn_id}: use the JSON form, not a URI: {raw}"
    return json.loads(raw)


def test_airflow_connections_point_at_the_services(airflow_env, docker_config):
    assert _conn(airflow_env, "spark_default") == {"conn_type": "spark", "host": "local[2]"}
    assert _conn(airflow_env, "spark_default")["host"] == docker_config.spark.master

    src = _conn(airflow_env, "dblog_source")
    assert src["conn_type"] == "mysql"
    assert (src["host"], int(src["port"]), src["login"]) == ("mariadb", CONTAINER_PORTS["mariadb"], "root")
    e = docker_config.source("shop").endpoint
    assert (src["host"], int(src["port"]), src["login"]) == (e.host, e.port, e.user)

    tgt = _conn(airflow_env, "dblog_target")
    assert tgt["conn_type"] == "postgres"
    assert (tgt["host"], int(tgt["port"]), tgt["login"], tgt["schema"]) == (
        "postgres", CONTAINER_PORTS["postgres"], "postgres", "warehouse")
    t = docker_config.target("warehouse").endpoint
    assert (tgt["host"], int(tgt["port"]), tgt["login"], tgt["schema"]) == (t.host, t.port, t.user, t.database)

    red = _conn(airflow_env, "dblog_redis")
    assert red["conn_type"] == "redis"
    assert (red["host"], int(red["port"])) == ("redis", CONTAINER_PORTS["redis"])
    assert f"redis://{red['host']}:{red['port']}/{red.get('extra', {}).get('db', 0)}" == docker_config.redis_url


def test_airflow_reads_the_connections(airflow_env, tmp_path):
    """Airflow's own env-var secrets backend and the Spark provider read them as meant."""
    code = r"""
import json
from airflow.secrets.environment_variables import EnvironmentVariablesBackend
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
b = EnvironmentVariablesBackend()
out = {}
for cid in ("dblog_source", "dblog_target", "dblog_redis", "spark_default"):
    c = b.get_connection(cid)
    out[cid] = c and {"conn_type": c.conn_type, "host": c.host, "port": c.port, "login": c.login,
                      "schema": c.schema, "extra": c.extra_dejson}
out["spark_master"] = SparkSubmitHook(conn_id="spark_default")._connection["master"]
print("RESULT " + json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({k: v for k, v in airflow_env.items() if k.startswith("AIRFLOW_CONN_")})
    env["AIRFLOW_HOME"] = str(tmp_path)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    assert got["spark_master"] == "local[2]"
    assert {k: (v["conn_type"], v["host"], v["port"]) for k, v in got.items() if k != "spark_master"} == {
        "dblog_source": ("mysql", "mariadb", 3306),
        "dblog_target": ("postgres", "postgres", 5432),
        "dblog_redis": ("redis", "redis", 6379),
        "spark_default": ("spark", "local[2]", None),
    }
    assert got["dblog_target"]["schema"] == "warehouse"


# --------------------------------------------------------------------------- #
# docker/dblog.docker.yaml
# --------------------------------------------------------------------------- #

def test_docker_config_points_at_the_services(docker_config, services):
    src = docker_config.source("shop").endpoint
    assert (src.host, src.port, src.user, src.password) == ("mariadb", CONTAINER_PORTS["mariadb"], "root", "")
    tgt = docker_config.target("warehouse").endpoint
    assert (tgt.host, tgt.port, tgt.user, tgt.database) == ("postgres", CONTAINER_PORTS["postgres"], "postgres",
                                                           "warehouse")
    assert docker_config.redis_url == f"redis://redis:{CONTAINER_PORTS['redis']}/0"
    assert {src.host, tgt.host, "redis"} <= set(services)
    assert docker_config.storage_root == "/data/dblog"


def test_docker_config_has_the_demo_shape(docker_config, demo_config):
    assert set(yaml.safe_load(DOCKER_CONFIG.read_text())) == set(yaml.safe_load(DEMO_CONFIG.read_text()))
    assert set(docker_config.sources) == set(demo_config.sources)
    assert set(docker_config.targets) == set(demo_config.targets)
    for name, s in demo_config.sources.items():
        d = docker_config.sources[name]
        assert d.tables == s.tables
        assert (d.kind, d.server_id, d.watermark_namespace, d.endpoint.user) == (
            s.kind, s.server_id, s.watermark_namespace, s.endpoint.user)
    for name, t in demo_config.targets.items():
        d = docker_config.targets[name]
        assert (d.kind, d.source, d.schema) == (t.kind, t.source, t.schema)
        if t.endpoint:   # a SQL target, or an Iceberg target's catalog (a Delta target has none)
            assert (d.endpoint.database, d.endpoint.user) == (t.endpoint.database, t.endpoint.user)
        if t.path:       # a lake target's tables: on the dblog-data volume
            assert d.path.startswith(docker_config.storage_root + "/"), d.path
    assert docker_config.state_prefix == demo_config.state_prefix
    assert docker_config.spark.master == demo_config.spark.master
    assert docker_config.dump == demo_config.dump
    assert docker_config.tail == demo_config.tail


def test_docker_config_credentials_come_from_the_environment(monkeypatch, airflow_env):
    raw = yaml.safe_load(DOCKER_CONFIG.read_text())
    # every server's credentials (a Delta target has no server)
    endpoints = [*raw["sources"].values(), *(t for t in raw["targets"].values() if t["kind"] != "delta")]
    refs = set()
    for e in endpoints:
        for field in ("user", "password"):
            m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}", str(e.get(field)))
            assert m, f"{field}: {e.get(field)!r} is not a ${{VAR}} / ${{VAR:-default}} reference"
            refs.add(m.group(1))
            if field == "password":
                # a password set for `docker compose up` must reach the config in the container
                assert m.group(1) in airflow_env, f"{m.group(1)} is not passed to the airflow service"
    for name in refs:
        monkeypatch.setenv(name, f"from-env-{name}")
    cfg = parse_config(raw, str(DOCKER_CONFIG))
    assert cfg.source("shop").endpoint.password == "from-env-DBLOG_SHOP_PASSWORD"
    assert cfg.target("warehouse").endpoint.password == "from-env-DBLOG_TARGET_PASSWORD"


# --------------------------------------------------------------------------- #
# Dockerfile and JDBC drivers
# --------------------------------------------------------------------------- #

def _apt_packages(dockerfile) -> set[str]:
    pkgs = set()
    for instr, args in dockerfile:
        if instr != "RUN":
            continue
        for m in re.finditer(r"apt-get\s+install\s+([^&;|]*)", args):
            pkgs |= {t for t in m.group(1).split() if not t.startswith("-")}
    return pkgs


def test_dockerfile(dockerfile):
    froms = [a for i, a in dockerfile if i == "FROM"]
    assert froms == ["python:3.11-slim-bookworm"]
    pkgs = _apt_packages(dockerfile)
    assert set(JDBC_PACKAGES) <= pkgs, pkgs
    assert pkgs & {"default-jre-headless", "openjdk-17-jre-headless"}, f"no Java runtime in {pkgs}"
    assert "procps" in pkgs
    runs = " ".join(a for i, a in dockerfile if i == "RUN")
    assert re.search(r"pip install (--[\w-]+ )*'?\.(\[[\w,]+\])?'?(\s|$)", runs), "the project is not pip-installed"
    for jar in JDBC_PACKAGES.values():
        assert f"test -f {jar}" in runs, f"the image build does not check {jar}"
    env = dockerfile_env(dockerfile)
    assert env["AIRFLOW_HOME"] == "/opt/airflow"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/dblog/dags"
    # spark-submit from the venv on PATH
    assert env["PATH"].split(":")[0] == f"{env['VIRTUAL_ENV']}/bin"
    cmds = [json.loads(a) for i, a in dockerfile if i == "CMD"]
    assert cmds[-1] == ["airflow", "standalone"]
    copies = [a for i, a in dockerfile if i == "COPY"]
    assert any(c.split()[-1] in ("/opt/dblog", "/opt/dblog/", ".", "./") and c.split()[0] == "." for c in copies)


def test_jdbc_jars_are_the_debian_packages_paths(docker_config):
    expected = {"/usr/share/java/mariadb-java-client.jar", "/usr/share/java/postgresql.jar"}
    assert set(JDBC_PACKAGES.values()) == expected
    assert set(docker_config.spark.jars) == expected
    assert set(SparkConfig().jars) == expected


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="no dpkg on this machine")
@pytest.mark.parametrize("package", sorted(JDBC_PACKAGES))
def test_jdbc_jar_is_in_its_debian_package(package):
    res = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"{package} is not installed here")
    assert JDBC_PACKAGES[package] in res.stdout.split()
