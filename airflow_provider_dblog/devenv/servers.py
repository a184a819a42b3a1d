"""Start and stop private MariaDB, PostgreSQL 15 and Redis instances.

The servers belong to this project only: they listen on 127.0.0.1 on
non-default ports (13306, 15432, 16379) and keep all their files under one
base directory (``$DBLOG_LOCAL_DIR``, default ``<repo>/.dblog-local``).
System-wide servers on 3306 / 5432 / 6379 are never touched.

Everything is idempotent: ``start()`` on running servers only checks that they
answer (a few milliseconds), ``stop()`` on stopped servers does nothing.

Command line::

    python -m airflow_provider_dblog.devenv.servers start  [--only mariadb,postgres,redis]
    python -m airflow_provider_dblog.devenv.servers stop   [--only ...]
    python -m airflow_provider_dblog.devenv.servers status

Only the standard library is needed, plus PyMySQL (MariaDB readiness check and
root account fix-up) and psycopg2 (PostgreSQL readiness check); both are
imported lazily.  No Airflow import.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

__all__ = [
    "HOST",
    "MARIADB_PORT",
    "POSTGRES_PORT",
    "REDIS_PORT",
    "SERVERS",
    "ServerError",
    "default_base",
    "mariadb_url",
    "postgres_url",
    "redis_url",
    "start",
    "status",
    "stop",
]

HOST = "127.0.0.1"
MARIADB_PORT = 13306
POSTGRES_PORT = 15432
REDIS_PORT = 16379
SERVERS = ("mariadb", "postgres", "redis")

PG_BIN = Path(os.environ.get("DBLOG_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
MARIADB_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"

# <repo>/airflow_provider_dblog/devenv/servers.py -> <repo>
_REPO_ROOT = Path(__file__).resolve().parents[2]
# Unix socket paths are limited to 108 bytes (including the NUL).
_MAX_SOCKET_PATH = 100
# Where the PostgreSQL files go when the postgres user cannot reach BASE
# (e.g. BASE under /root, which is mode 0700).
_PG_FALLBACK_PARENT = Path("/var/tmp")


class ServerError(RuntimeError):
    """A private server could not be started or stopped."""


# --------------------------------------------------------------------------- #
# Small helpers
# --------------------------------------------------------------------------- #


def default_base() -> Path:
    """``$DBLOG_LOCAL_DIR`` or ``<repo>/.dblog-local`` (absolute)."""
    env = os.environ.get("DBLOG_LOCAL_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO_ROOT / "setup.cfg").exists():
        return _REPO_ROOT / ".dblog-local"
    return Path.cwd().resolve() / ".dblog-local"


def _base(base: str | os.PathLike[str] | None) -> Path:
    b = default_base() if base is None else Path(base).expanduser().resolve()
    b.mkdir(parents=True, exist_ok=True)
    return b


def _base_hash(base: Path) -> str:
    return hashlib.sha256(str(base).encode()).hexdigest()[:12]


def _which(name: str, *extra_dirs: str | os.PathLike[str]) -> str:
    found = shutil.which(name)
    if found:
        return found
    for d in (*extra_dirs, "/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin"):
        cand = Path(d) / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise ServerError(
        f"{name!r} not found. Run airflow_provider_dblog/devenv/bootstrap.sh, "
        "which installs the Debian packages (mariadb-server, postgresql-15, redis-server)."
    )


def _is_root() -> bool:
    return os.geteuid() == 0


def _port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        first = path.read_text().split("\n", 1)[0].strip()
        return int(first) if first else None
    except (OSError, ValueError):
        return None


def _proc_alive(pid: int | None, needle: bytes | None = None) -> bool:
    """True if *pid* runs (not a zombie) and its command line contains *needle*."""
    if not pid or pid <= 0:
        return False
    proc = Path("/proc") / str(pid)
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            state = stat.rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X", "x"):
                return False
            if needle is not None and needle not in (proc / "cmdline").read_bytes():
                return False
            return True
        except (OSError, IndexError):
            return False
    try:  # no /proc: best effort
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


def _terminate(pid: int, needle: bytes, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM *pid*, wait for it to go, SIGKILL after *timeout*."""
    if not _proc_alive(pid, needle):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _proc_alive(pid, needle):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _proc_alive(pid, needle):
        time.sleep(0.05)


def _spawn_detached(cmd: list[str], out_path: Path, cwd: Path) -> int:
    """Start *cmd* in its own session, fully detached (double fork via sh).

    The intermediate shell exits at once, so the server is re-parented and never
    becomes a zombie of (or gets a signal from) the calling process.
    """
    script = 'out=$1; shift; "$@" </dev/null >>"$out" 2>&1 & echo $!'
    res = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(out_path), *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
        timeout=30,
    )
    if res.returncode != 0 or not res.stdout.strip().isdigit():
        raise ServerError(f"could not spawn {cmd[0]}: {res.stderr.strip() or res.stdout.strip()}")
    return int(res.stdout.strip())


def _port_in_use_error(name: str, port: int, base: Path) -> ServerError:
    return ServerError(
        f"{name}: port {port} on {HOST} is already in use by a process that is not the "
        f"private {name} under {base}. Stop that process (or the private servers of "
        "another checkout / DBLOG_LOCAL_DIR) and try again."
    )


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    """Serialise start/stop of the servers of one base directory."""
    with open(base / ".servers.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _normalise(which: str | Iterable[str] | None) -> tuple[str, ...]:
    if which is None:
        return SERVERS
    if isinstance(which, str):
        which = which.split(",")
    names = tuple(dict.fromkeys(w.strip().lower() for w in which if w and w.strip()))
    aliases = {"mysql": "mariadb", "pg": "postgres", "postgresql": "postgres"}
    names = tuple(aliases.get(n, n) for n in names)
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        raise ValueError(f"unknown server(s) {unknown}; choose from {', '.join(SERVERS)}")
    return names


# --------------------------------------------------------------------------- #
# URLs
# --------------------------------------------------------------------------- #


def mariadb_url(database: str = "", driver: str = "pymysql") -> str:
    return f"mysql+{driver}://root@{HOST}:{MARIADB_PORT}/{database}"


def postgres_url(database: str = "postgres", driver: str = "psycopg2") -> str:
    return f"postgresql+{driver}://{PG_USER}@{HOST}:{POSTGRES_PORT}/{database}"


def redis_url(db: int = 0) -> str:
    return f"redis://{HOST}:{REDIS_PORT}/{db}"


# --------------------------------------------------------------------------- #
# MariaDB
# --------------------------------------------------------------------------- #


def _mariadb_paths(base: Path) -> dict[str, Path]:
    root = base / "mariadb"
    sock = root / "mariadbd.sock"
    if len(str(sock)) > _MAX_SOCKET_PATH:
        sock = Path("/tmp") / f"dblog-{_base_hash(base)}-mariadbd.sock"
    return {
        "root": root,
        "data": root / "data",
        "socket": sock,
        "pid": root / "mariadbd.pid",
        "log": root / "mariadbd.err",
        "out": root / "mariadbd.out",
        "marker": root / ".initialized",
        "binlog": root / "data" / "binlog",
    }


def _mariadb_info(p: dict[str, Path]) -> dict:
    return {
        "host": HOST,
        "port": MARIADB_PORT,
        "user": "root",
        "password": "",
        "socket": str(p["socket"]),
        "datadir": str(p["data"]),
        "binlog_basename": str(p["binlog"]),
        "log": str(p["log"]),
        "pid": _read_pid(p["pid"]),
        "url": mariadb_url(),
        "jdbc_url": f"jdbc:mysql://{HOST}:{MARIADB_PORT}/",
        "jdbc_driver": "org.mariadb.jdbc.Driver",
        "jdbc_jar": MARIADB_JDBC_JAR,
    }


def _mariadb_init(p: dict[str, Path]) -> bool:
    data = p["data"]
    if p["marker"].exists() or (data / "mysql" / "global_priv.frm").exists():
        p["marker"].touch()
        return False
    if data.exists() and any(data.iterdir()):
        # No system tables: a previous initialisation was interrupted.
        shutil.rmtree(data)
    data.mkdir(parents=True, exist_ok=True)
    cmd = [
        _which("mariadb-install-db"),
        "--no-defaults",
        f"--datadir={data}",
        "--user=root" if _is_root() else f"--user={_current_user()}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
    ]
    res = subprocess.run(cmd, cwd=p["root"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ServerError(
            f"mariadb-install-db failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        )
    p["marker"].write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    return True


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


# The server settings CDC depends on (not where files live): docker/compose.yaml must
# match them, and tests/test_docker_compose.py checks that it does.
MARIADB_SETTINGS = (
    "--server-id=1",
    "--binlog-format=ROW",
    "--binlog-row-image=FULL",
    "--binlog-row-metadata=FULL",
    "--default-time-zone=+00:00",
    "--max-connections=300",
    "--innodb-buffer-pool-size=512M",
    # --no-defaults drops Debian's utf8mb4 defaults; the compiled-in default is latin1.
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
)
POSTGRES_SETTINGS = ("wal_level=logical", "max_replication_slots=20", "max_wal_senders=20",
                     "fsync=off", "timezone=UTC")
REDIS_SETTINGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


def _mariadb_cmd(p: dict[str, Path]) -> list[str]:
    cmd = [_which("mariadbd"), "--no-defaults"]
    if _is_root():
        cmd.append("--user=root")
    cmd += [
        f"--datadir={p['data']}",
        f"--port={MARIADB_PORT}",
        f"--bind-address={HOST}",
        f"--socket={p['socket']}",
        f"--pid-file={p['pid']}",
        f"--log-error={p['log']}",
        f"--log-bin={p['binlog']}",
        "--skip-name-resolve",
        *MARIADB_SETTINGS,
    ]
    return cmd


def _mariadb_fix_root_tcp(p: dict[str, Path]) -> None:
    """Make root@127.0.0.1 exist with an empty password (via the unix socket)."""
    import pymysql

    conn = pymysql.connect(unix_socket=str(p["socket"]), user="root", password="", connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''")
            cur.execute("ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY ''")
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
            cur.execute("FLUSH PRIVILEGES")
        conn.commit()
    finally:
        conn.close()


def _mariadb_wait(p: dict[str, Path], pid: int, timeout: float = START_TIMEOUT) -> None:
    import pymysql

    deadline = time.monotonic() + timeout
    fixed = False
    last: Exception | None = None
    while True:
        if not _proc_alive(pid, _mariadb_needle(p)):
            raise ServerError(
                f"mariadbd (pid {pid}) exited during start-up. Tail of {p['log']}:\n{_tail(p['log'])}"
                f"\n--- {p['out']}:\n{_tail(p['out'], 10)}"
            )
        try:
            conn = pymysql.connect(
                host=HOST, port=MARIADB_PORT, user="root", password="", connect_timeout=2
            )
        except pymysql.err.OperationalError as exc:
            last = exc
            code = exc.args[0] if exc.args else None
            # 1045 access denied, 1130 host not allowed, 1698 unix_socket-only root
            if code in (1045, 1130, 1698) and not fixed and p["socket"].exists():
                _mariadb_fix_root_tcp(p)
                fixed = True
                continue
        else:
            conn.close()
            return
        if time.monotonic() >= deadline:
            raise ServerError(
                f"MariaDB on {HOST}:{MARIADB_PORT} did not accept root (empty password) within "
                f"{timeout:.0f}s (last error: {last}). Tail of {p['log']}:\n{_tail(p['log'])}"
            )
        time.sleep(0.1)


def _mariadb_needle(p: dict[str, Path]) -> bytes:
    # our own datadir: a reused pid (e.g. the system mariadbd) does not match
    return f"--datadir={p['data']}".encode()


def _mariadb_running(p: dict[str, Path]) -> int | None:
    pid = _read_pid(p["pid"])
    return pid if _proc_alive(pid, _mariadb_needle(p)) else None


def _start_mariadb(base: Path) -> dict:
    p = _mariadb_paths(base)
    p["root"].mkdir(parents=True, exist_ok=True)
    pid = _mariadb_running(p)
    if pid:
        _mariadb_wait(p, pid)
        return {**_mariadb_info(p), "already_running": True}
    p["pid"].unlink(missing_ok=True)  # stale
    if _port_open(MARIADB_PORT):
        raise _port_in_use_error("mariadb", MARIADB_PORT, base)
    initialised = _mariadb_init(p)
    with contextlib.suppress(FileNotFoundError):
        if p["socket"].is_socket():
            p["socket"].unlink()
    pid = _spawn_detached(_mariadb_cmd(p), p["out"], p["root"])
    _mariadb_wait(p, pid)
    return {**_mariadb_info(p), "pid": pid, "already_running": False, "initialised": initialised}


def _stop_mariadb(base: Path) -> bool:
    p = _mariadb_paths(base)
    pid = _mariadb_running(p)
    if pid:
        _terminate(pid, _mariadb_needle(p))
    p["pid"].unlink(missing_ok=True)
    return bool(pid)


# --------------------------------------------------------------------------- #
# PostgreSQL
# --------------------------------------------------------------------------- #


def _pg_ids() -> tuple[int, int]:
    import pwd

    try:
        pw = pwd.getpwnam(PG_USER)
    except KeyError:
        raise ServerError(
            f"system user {PG_USER!r} does not exist; install postgresql-15 (bootstrap.sh does)"
        ) from None
    return pw.pw_uid, pw.pw_gid


def _as_pg(cmd: list[str]) -> list[str]:
    if _is_root():
        return [_which("runuser"), "-u", PG_USER, "--", *cmd]
    return cmd


def _make_pg_dir(path: Path) -> bool:
    """Create *path* for the postgres user; True if that user can write into it."""
    path.mkdir(parents=True, exist_ok=True)
    if not _is_root():
        return os.access(path, os.W_OK | os.X_OK)
    uid, gid = _pg_ids()
    st = path.stat()
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid)
    os.chmod(path, 0o700)
    res = subprocess.run(
        _as_pg(["/usr/bin/test", "-w", str(path), "-a", "-x", str(path)]),
        cwd="/",
        capture_output=True,
        check=False,
    )
    return res.returncode == 0


def _pg_root(base: Path) -> Path:
    """Directory holding the PostgreSQL data, log and socket, owned by postgres.

    ``BASE/postgres`` when the postgres user can reach it; otherwise (BASE under
    a directory postgres cannot traverse, such as /root) a fallback
    ``/var/tmp/dblog-pg-<hash of BASE>``, recorded in ``BASE/postgres.location``.
    """
    record = base / "postgres.location"
    if record.exists():
        chosen = Path(record.read_text().strip())
        if not _make_pg_dir(chosen):
            raise ServerError(f"user {PG_USER} cannot write {chosen} (from {record})")
        return chosen
    preferred = base / "postgres"
    if _make_pg_dir(preferred):
        return preferred
    with contextlib.suppress(OSError):
        preferred.rmdir()
    fallback = _PG_FALLBACK_PARENT / f"dblog-pg-{_base_hash(base)}"
    if not _make_pg_dir(fallback):
        raise ServerError(
            f"user {PG_USER} can neither write {preferred} nor {fallback}; "
            "set DBLOG_LOCAL_DIR to a directory every user can traverse"
        )
    record.write_text(f"{fallback}\n")
    return fallback


def _pg_paths(base: Path) -> dict[str, Path]:
    root = _pg_root(base)
    sockdir = root
    if len(str(root / f".s.PGSQL.{POSTGRES_PORT}.lock")) > _MAX_SOCKET_PATH:
        sockdir = Path("/tmp") / f"dblog-{_base_hash(base)}-pgsock"
        _make_pg_dir(sockdir)
    return {
        "root": root,
        "data": root / "data",
        "log": root / "postgres.log",
        "sockdir": sockdir,
        "marker": root / ".initialized",
        "pid": root / "data" / "postmaster.pid",
    }


def _pg_info(p: dict[str, Path]) -> dict:
    return {
        "host": HOST,
        "port": POSTGRES_PORT,
        "user": PG_USER,
        "password": "",
        "dbname": "postgres",
        "datadir": str(p["data"]),
        "socket_dir": str(p["sockdir"]),
        "log": str(p["log"]),
        "pid": _read_pid(p["pid"]),
        "url": postgres_url(),
        "dsn": f"host={HOST} port={POSTGRES_PORT} user={PG_USER} dbname=postgres",
        "jdbc_url": f"jdbc:postgresql://{HOST}:{POSTGRES_PORT}/postgres",
        "jdbc_driver": "org.postgresql.Driver",
        "jdbc_jar": POSTGRES_JDBC_JAR,
    }


def _pg_bin(name: str) -> str:
    path = PG_BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ServerError(f"{path} not found; install postgresql-15 (bootstrap.sh does)")
    return str(path)


def _pg_init(p: dict[str, Path]) -> bool:
    data = p["data"]
    if p["marker"].exists() or (data / "global" / "pg_control").exists():
        p["marker"].touch()
        return False
    if data.exists():
        shutil.rmtree(data)  # an interrupted initdb
    cmd = [
        _pg_bin("initdb"),
        "-D",
        str(data),
        "-A",
        "trust",
        "-U",
        PG_USER,
        "--encoding=UTF8",
        "--locale=C",
    ]
    res = subprocess.run(_as_pg(cmd), cwd=p["root"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ServerError(f"initdb failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    p["marker"].write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    return True


def _pg_wait(p: dict[str, Path], timeout: float = START_TIMEOUT) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg2.connect(
                host=HOST, port=POSTGRES_PORT, user=PG_USER, dbname="postgres", connect_timeout=2
            )
        except psycopg2.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"PostgreSQL on {HOST}:{POSTGRES_PORT} did not accept connections within "
                    f"{timeout:.0f}s ({exc}). Tail of {p['log']}:\n{_tail(p['log'])}"
                ) from None
            if not _pg_running(p):
                raise ServerError(
                    f"PostgreSQL is not running. Tail of {p['log']}:\n{_tail(p['log'])}"
                ) from None
            time.sleep(0.1)
        else:
            conn.close()
            return


def _pg_needle(p: dict[str, Path]) -> bytes:
    # the postmaster runs as `postgres -D <our datadir> ...`
    return b"\0" + str(p["data"]).encode() + b"\0"


def _pg_running(p: dict[str, Path]) -> int | None:
    pid = _read_pid(p["pid"])
    return pid if _proc_alive(pid, _pg_needle(p)) else None


def _start_postgres(base: Path) -> dict:
    p = _pg_paths(base)
    if _pg_running(p):
        _pg_wait(p)
        return {**_pg_info(p), "already_running": True}
    if _port_open(POSTGRES_PORT):
        raise _port_in_use_error("postgres", POSTGRES_PORT, base)
    # Not running and the port is free: lock files left by a killed server are
    # stale (their pid may have been reused, or be a not-yet-reaped zombie).
    for stale in (p["pid"], p["sockdir"] / f".s.PGSQL.{POSTGRES_PORT}.lock"):
        stale.unlink(missing_ok=True)
    initialised = _pg_init(p)
    opts = " ".join(
        [
            f"-c port={POSTGRES_PORT}",
            f"-c listen_addresses={HOST}",
            f"-c unix_socket_directories={shlex.quote(str(p['sockdir']))}",
            *(f"-c {setting}" for setting in POSTGRES_SETTINGS),
        ]
    )
    cmd = [
        _pg_bin("pg_ctl"),
        "-D",
        str(p["data"]),
        "-w",
        "-t",
        str(int(START_TIMEOUT)),
        "-l",
        str(p["log"]),
        "-o",
        opts,
        "start",
    ]
    for attempt in range(4):
        res = subprocess.run(
            _as_pg(cmd),
            cwd=p["root"],
            capture_output=True,
            text=True,
            start_new_session=True,
            check=False,
            timeout=START_TIMEOUT + 30,
        )
        if res.returncode == 0 or attempt == 3:
            break
        # After a crash (kill -9), orphaned backends may still hold the shared
        # memory / lock files for a moment: retry shortly.
        time.sleep(1.5)
        for stale in (p["pid"], p["sockdir"] / f".s.PGSQL.{POSTGRES_PORT}.lock"):
            if not _pg_running(p):
                stale.unlink(missing_ok=True)
    if res.returncode != 0:
        raise ServerError(
            f"pg_ctl start failed (exit {res.returncode}): {res.stdout.strip()} {res.stderr.strip()}\n"
            f"Tail of {p['log']}:\n{_tail(p['log'])}"
        )
    _pg_wait(p)
    return {**_pg_info(p), "already_running": False, "initialised": initialised}


def _stop_postgres(base: Path) -> bool:
    p = _pg_paths(base)
    pid = _pg_running(p)
    if not pid:
        return False
    subprocess.run(
        _as_pg([_pg_bin("pg_ctl"), "-D", str(p["data"]), "-m", "fast", "-w", "-t", "60", "stop"]),
        cwd=p["root"],
        capture_output=True,
        check=False,
        timeout=STOP_TIMEOUT + 30,
    )
    _terminate(pid, _pg_needle(p))
    return True


# --------------------------------------------------------------------------- #
# Redis
# --------------------------------------------------------------------------- #


def _redis_paths(base: Path) -> dict[str, Path]:
    root = base / "redis"
    return {"root": root, "pid": root / "redis.pid", "log": root / "redis.log"}


def _redis_info(p: dict[str, Path]) -> dict:
    return {
        "host": HOST,
        "port": REDIS_PORT,
        "url": redis_url(),
        "dir": str(p["root"]),
        "log": str(p["log"]),
        "pid": _read_pid(p["pid"]),
    }


def _redis_ping(timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, REDIS_PORT), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_wait(p: dict[str, Path], timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not _redis_ping():
        if time.monotonic() >= deadline:
            raise ServerError(
                f"Redis on {HOST}:{REDIS_PORT} did not answer PING within {timeout:.0f}s. "
                f"Tail of {p['log']}:\n{_tail(p['log'])}"
            )
        time.sleep(0.05)


# redis-server rewrites its title to "redis-server 127.0.0.1:16379"
_REDIS_NEEDLE = f"redis-server {HOST}:{REDIS_PORT}".encode()


def _redis_running(p: dict[str, Path]) -> int | None:
    pid = _read_pid(p["pid"])
    return pid if _proc_alive(pid, _REDIS_NEEDLE) else None


def _start_redis(base: Path) -> dict:
    p = _redis_paths(base)
    p["root"].mkdir(parents=True, exist_ok=True)
    if _redis_running(p):
        _redis_wait(p)
        return {**_redis_info(p), "already_running": True}
    p["pid"].unlink(missing_ok=True)
    if _port_open(REDIS_PORT):
        raise _port_in_use_error("redis", REDIS_PORT, base)
    cmd = [
        _which("redis-server"),
        "--port", str(REDIS_PORT),
        "--bind", HOST,
        "--daemonize", "yes",
        "--dir", str(p["root"]),
        "--pidfile", str(p["pid"]),
        "--logfile", str(p["log"]),
        *REDIS_SETTINGS,
    ]  # fmt: skip
    res = subprocess.run(
        cmd, cwd=p["root"], capture_output=True, text=True, start_new_session=True, check=False, timeout=30
    )
    if res.returncode != 0:
        raise ServerError(
            f"redis-server failed (exit {res.returncode}): {res.stdout.strip()} {res.stderr.strip()}\n"
            f"Tail of {p['log']}:\n{_tail(p['log'])}"
        )
    _redis_wait(p)
    return {**_redis_info(p), "already_running": False}


def _stop_redis(base: Path) -> bool:
    p = _redis_paths(base)
    pid = _redis_running(p)
    if pid:
        _terminate(pid, _REDIS_NEEDLE)  # SIGTERM: redis fsyncs the AOF and exits
    p["pid"].unlink(missing_ok=True)
    return bool(pid)


# --------------------------------------------------------------------------- #
# Public API
# --------------------------------------------------------------------------- #

_STARTERS = {"mariadb": _start_mariadb, "postgres": _start_postgres, "redis": _start_redis}
_STOPPERS = {"mariadb": _stop_mariadb, "postgres": _stop_postgres, "redis": _stop_redis}


def start(
    which: str | Iterable[str] = SERVERS, base: str | os.PathLike[str] | None = None
) -> dict[str, dict]:
    """Start (or just check) the private servers; return their connection info.

    Each entry has at least ``host``, ``port``, ``url``, ``pid`` and
    ``already_running``; MariaDB/PostgreSQL also ``user``, ``password``,
    ``jdbc_url``, ``jdbc_driver`` and ``jdbc_jar``; plus ``seconds``.
    """
    names = _normalise(which)
    b = _base(base)
    out: dict[str, dict] = {}
    with _locked(b):
        for name in names:
            t0 = time.monotonic()
            info = _STARTERS[name](b)
            info["seconds"] = round(time.monotonic() - t0, 3)
            out[name] = info
    return out


def stop(which: str | Iterable[str] = SERVERS, base: str | os.PathLike[str] | None = None) -> dict[str, bool]:
    """Stop the private servers; ``{name: True if it was running}``."""
    names = _normalise(which)
    b = _base(base)
    with _locked(b):
        return {name: _STOPPERS[name](b) for name in names}


def status(base: str | os.PathLike[str] | None = None) -> dict[str, dict]:
    """``{name: {running, answering, pid, port, ...}}`` without starting anything."""
    b = _base(base)
    out: dict[str, dict] = {}
    for name, paths_of, running, info, port in (
        ("mariadb", _mariadb_paths, _mariadb_running, _mariadb_info, MARIADB_PORT),
        ("postgres", _pg_paths, _pg_running, _pg_info, POSTGRES_PORT),
        ("redis", _redis_paths, _redis_running, _redis_info, REDIS_PORT),
    ):
        try:
            paths = paths_of(b)
            pid = running(paths)
            entry = info(paths)
        except ServerError as exc:
            pid, entry = None, {"host": HOST, "port": port, "error": str(exc)}
        entry.update(running=bool(pid), pid=pid, answering=_port_open(port))
        out[name] = entry
    return out


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def _where(info: dict) -> str:
    return info.get("datadir") or info.get("dir") or ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_dblog.devenv.servers",
        description="Private MariaDB/PostgreSQL/Redis servers for airflow-provider-dblog.",
    )
    parser.add_argument("command", choices=("start", "stop", "restart", "status"))
    parser.add_argument("--only", default=",".join(SERVERS), help="comma-separated subset of " + ",".join(SERVERS))
    parser.add_argument("--base", default=None, help="base directory (default: $DBLOG_LOCAL_DIR or <repo>/.dblog-local)")
    args = parser.parse_args(argv)
    try:
        names = _normalise(args.only)
        if args.command in ("stop", "restart"):
            for name, was in stop(names, args.base).items():
                print(f"{name:<9} {'stopped' if was else 'not running'}")
        if args.command in ("start", "restart"):
            for name, info in start(names, args.base).items():
                state = "already running" if info["already_running"] else "started"
                print(
                    f"{name:<9} {state:<16} {HOST}:{info['port']:<6} pid={info['pid']} "
                    f"({info['seconds']:.2f}s) {_where(info)}"
                )
        if args.command == "status":
            for name, info in status(args.base).items():
                if name not in names:
                    continue
                state = "running" if info["running"] else ("port busy (not ours)" if info["answering"] else "stopped")
                extra = info.get("error") or _where(info)
                print(f"{name:<9} {state:<16} {HOST}:{info['port']:<6} pid={info['pid']} {extra}")
    except (ServerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
