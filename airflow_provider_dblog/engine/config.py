"""The one YAML config read by the engine, the ``dblog`` command and the DAG factory.

Credentials stay out of the file, two ways:

* ``${NAME}`` or ``${NAME:-default}`` in any value reads the environment;
* ``conn_id: NAME`` on a source, target or the state names a connection in
  Airflow's own environment form, ``AIRFLOW_CONN_<NAME>`` (a URI or JSON). Inside
  Airflow the provider's hook resolves the connection from Airflow and hands the
  engine (and the Spark jobs it starts) that variable; outside, set it yourself.
  Fields written in the YAML win over the connection's.

Passwords never appear in a repr or a log.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml

from .connections import _expand, _with_connection, conn_env_name, connection_fields  # noqa: F401
from .errors import ConfigError, UnknownTableError
from .schema_evolution import EVOLVE, parse_setting

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,63}$")
SOURCE_KINDS = ("mysql", "postgres")
# a MySQL/MariaDB source's binlog decoder: the pure-Python library, or the compiled one
DECODERS = ("mysql-replication", "mysql-event-stream")
DEFAULT_DECODER = "mysql-event-stream"
TARGET_KINDS = ("postgres", "delta", "iceberg")
_Part = TypeVar("_Part")  # a configured source or target


def check_identifier(name: str, what: str = "identifier") -> str:
    """Table, database and column names are checked before they reach SQL."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ConfigError(f"{what} {name!r} is not a plain SQL identifier")
    return name


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    password: str = field(default="", repr=False)
    database: str = ""


@dataclass(frozen=True)
class SourceConfig:
    name: str
    kind: str
    endpoint: Endpoint
    tables: tuple[str, ...]  # "db.table" (MySQL) or "schema.table" (PostgreSQL)
    server_id: int = 4242
    watermark_namespace: str = "dblog"
    slot: str = ""
    publication: str = ""
    # MySQL zero dates ('0000-00-00', '2024-00-10'): "refuse" (hold the table's apply,
    # name the value) or "null" (carry them as NULL, a choice the user makes knowingly)
    zero_dates: str = "refuse"
    # what the targets do at a change of a table's shape (engine/schema_evolution.py):
    # evolve, lenient, ignore or fail; for all tables, then per table
    schema_changes: str = "evolve"
    schema_changes_tables: tuple[tuple[str, str], ...] = ()
    # how soon a caught-up tail hears from an idle log (binlog heartbeat, pgoutput wait):
    # the cadence of its idle flushes, lease renewals and stop checks
    heartbeat_seconds: float = 0.5
    # MySQL/MariaDB: the binlog decoder (sources/mysql/mes_reader.py)
    decoder: str = DEFAULT_DECODER

    def schema_changes_for(self, table: str) -> str:
        return dict(self.schema_changes_tables).get(table, self.schema_changes)

    def table(self, qualified: str) -> str:
        if qualified not in self.tables:
            raise UnknownTableError(
                f"table {qualified!r} is not configured for source {self.name!r}; "
                f"configured: {', '.join(self.tables)}")
        return qualified


@dataclass(frozen=True)
class TargetConfig:
    name: str
    kind: str
    endpoint: Endpoint | None   # a SQL target's server (None for a lake target)
    source: str
    schema: str = "public"
    path: str = ""              # a lake target's root: one table directory per source table
    changelog: bool = False     # a lake target: also each table's changelog (targets/changelog.py)
    # a lake target on an object store: the options its library takes (delta-rs's
    # storage_options, PyIceberg's FileIO properties), credentials from ${ENV} only
    storage_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)   # (secrets: never logged)


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    jars: tuple[str, ...] = ("/usr/share/java/mariadb-java-client.jar", "/usr/share/java/postgresql.jar")
    conf: dict = field(default_factory=dict)
    driver_memory: str = "2g"
    # CPU niceness (0-19) of spark-submit and its JVM: where Spark shares a host with the
    # source database, a positive value keeps the database's writes ahead of the dump
    nice: int = 0
    # on a cluster: what each executor gets (spark-submit's --executor-memory and
    # --executor-cores), and the Python the executors run (spark.pyspark.python; default:
    # the submitting process's own, right for local mode and for workers installed alike)
    executor_memory: str = ""
    executor_cores: int | None = None
    python: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.nice, bool) or not isinstance(self.nice, int) or not 0 <= self.nice <= 19:
            raise ConfigError(f"spark.nice must be an integer from 0 to 19, not {self.nice!r}")
        c = self.executor_cores
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ConfigError(f"spark.executor_cores must be an integer >= 1, not {c!r}")
        if self.executor_memory and not re.fullmatch(r"\d+[kmgtKMGT]?", str(self.executor_memory)):
            raise ConfigError(f"spark.executor_memory must look like 2g or 512m, not {self.executor_memory!r}")
        if "spark.master" in (self.conf or {}):
            raise ConfigError("spark.conf sets spark.master: give the master as the spark section's own "
                              "`master` (it becomes spark-submit's --master), not as a conf setting")
        mode = str((self.conf or {}).get("spark.submit.deployMode", "client"))
        if mode != "client":
            raise ConfigError(f"spark.conf sets spark.submit.deployMode={mode}: the jobs run in client mode "
                              "only (the driver reports each job's result to the process that submitted it)")


@dataclass(frozen=True)
class DumpConfig:
    chunk_size: int = 50_000
    parallelism: int = 4
    window_timeout_s: float = 120.0
    chunks_per_job: int = 1_000
    # one runner per request: it holds the request's lease, renewed every lease_seconds/3
    lease_seconds: float = 30.0
    # a window open this long whose request no runner holds was left by a dead runner: the
    # tail closes it as abandoned (None: max(900, 3 * window_timeout_s))
    abandon_after_s: float | None = None
    # the source or Redis away during a chunk: redo the chunk with backoff for this long, then fail
    retry_for_s: float = 300.0
    pipeline: bool = True   # select the next chunk while one finishes (engine/dump_ahead.py)

    def __post_init__(self) -> None:
        for name in ("lease_seconds", "window_timeout_s", "retry_for_s"):
            _positive_seconds(self, "dump", name)
        if not isinstance(self.pipeline, bool):
            raise ConfigError(f"dump.pipeline must be true or false, not {self.pipeline!r}")
        v = self.abandon_after_s
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= self.lease_seconds):
            raise ConfigError(f"dump.abandon_after_s must be a number of seconds > dump.lease_seconds "
                              f"({self.lease_seconds}), or null for max(900, 3 * window_timeout_s); not {v!r}")

    @property
    def abandon_after(self) -> float:
        if self.abandon_after_s is not None:
            return float(self.abandon_after_s)
        return max(900.0, 3 * self.window_timeout_s)


@dataclass(frozen=True)
class TailConfig:
    flush_events: int = 20_000
    flush_seconds: float = 1.0
    lease_seconds: float = 30.0
    progress_seconds: float = 30.0   # how often a running tail logs its progress (0: never)
    # the source or Redis away: retry from the checkpoint with backoff for this long, then fail
    retry_for_s: float = 300.0

    def __post_init__(self) -> None:
        _positive_seconds(self, "tail", "retry_for_s")


@dataclass(frozen=True)
class ApplyConfig:
    # an apply run whose tables hold at most this many events to apply runs in-process
    # (pyarrow + COPY, about a second) instead of spark-submit (tens of seconds of start-up);
    # 0: always on Spark
    local_max_events: int = 200_000
    # the target or Redis away: redo the table's batch with backoff for this long, then fail
    retry_for_s: float = 300.0

    def __post_init__(self) -> None:
        v = self.local_max_events
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"apply.local_max_events must be an integer >= 0 (0: always Spark), not {v!r}")
        _positive_seconds(self, "apply", "retry_for_s")


def _positive_seconds(section, where: str, name: str) -> None:
    v = getattr(section, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"{where}.{name} must be a number of seconds > 0, not {v!r}")


@dataclass(frozen=True)
class Config:
    sources: dict[str, SourceConfig]
    targets: dict[str, TargetConfig]
    redis_url: str
    state_prefix: str
    storage_root: str
    spark: SparkConfig
    dump: DumpConfig
    tail: TailConfig
    path: str = ""
    apply: ApplyConfig = field(default_factory=ApplyConfig)

    def source(self, name: str | None = None) -> SourceConfig:
        return _named(self.sources, name, "source")

    def target(self, name: str | None = None) -> TargetConfig:
        return _named(self.targets, name, "target")


def _named(configured: dict[str, _Part], name: str | None, kind: str) -> _Part:
    """The ``kind`` (source or target) called ``name``; None names the only one configured."""
    if name is None:
        if len(configured) != 1:
            raise ConfigError(f"several {kind}s configured, name one of: {', '.join(configured)}")
        return next(iter(configured.values()))
    if name not in configured:
        raise ConfigError(f"unknown {kind} {name!r}; configured: {', '.join(configured)}")
    return configured[name]


def _endpoint(d: dict, where: str) -> Endpoint:
    try:
        return Endpoint(host=str(d.get("host", "127.0.0.1")), port=int(d["port"]),
                        user=str(d["user"]), password=str(d.get("password", "")),
                        database=str(d.get("database", "")))
    except KeyError as e:
        raise ConfigError(f"{where}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _qualified(name: Any, where: str) -> str:
    parts = str(name).split(".")
    if len(parts) != 2:
        raise ConfigError(f"{where}: table {name!r} must be written as namespace.table")
    for p in parts:
        check_identifier(p, f"{where}: name part")
    return str(name)


def _section(cls, d: dict | None, where: str):
    d = d or {}
    known = set(cls.__dataclass_fields__)
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    try:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def parse_config(raw: dict, path: str = "", env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    raw = _expand(raw or {}, "config", env)
    sources = {}
    for name, d in (raw.get("sources") or {}).items():
        where = f"sources.{name}"
        d = _with_connection(d, env, where)
        check_identifier(name, f"{where}: source name")
        kind = d.get("kind")
        if kind not in SOURCE_KINDS:
            raise ConfigError(f"{where}: kind must be one of {SOURCE_KINDS}, not {kind!r}")
        tables = tuple(_qualified(t, where) for t in d.get("tables") or [])
        if not tables:
            raise ConfigError(f"{where}: list the tables to capture under 'tables'")
        sources[name] = SourceConfig(
            name=name, kind=kind, endpoint=_endpoint(d, where), tables=tables,
            server_id=int(d.get("server_id", 4242)),
            watermark_namespace=check_identifier(d.get("watermark_namespace", "dblog")),
            slot=str(d.get("slot", f"dblog_{name}")),
            publication=str(d.get("publication", f"dblog_{name}")),
            zero_dates=_choice(d.get("zero_dates", "refuse"), ("refuse", "null"), f"{where}.zero_dates"),
            heartbeat_seconds=_seconds(d.get("heartbeat_seconds", 0.5), 0.01, 10.0, f"{where}.heartbeat_seconds"),
            decoder=_decoder(d, kind, where),
            **_schema_changes(d.get("schema_changes", EVOLVE), tables, where))
    if not sources:
        raise ConfigError("config: no sources configured")
    targets = {}
    for name, d in (raw.get("targets") or {}).items():
        where = f"targets.{name}"
        d = _with_connection(d, env, where)
        check_identifier(name, f"{where}: target name")
        if d.get("kind") not in TARGET_KINDS:
            raise ConfigError(f"{where}: kind must be one of {TARGET_KINDS}, not {d.get('kind')!r}")
        if d.get("source") not in sources:
            raise ConfigError(f"{where}: source {d.get('source')!r} is not configured")
        if d["kind"] in ("delta", "iceberg") and not str(d.get("path") or "").strip():
            raise ConfigError(f"{where}: a {d['kind']} target needs 'path' (the directory its tables live under)")
        changelog = d.get("changelog", False)
        if not isinstance(changelog, bool):
            raise ConfigError(f"{where}.changelog: must be true or false, not {changelog!r}")
        if changelog and d["kind"] not in ("delta", "iceberg"):
            raise ConfigError(f"{where}.changelog: only a delta or iceberg target keeps changelog tables, "
                              f"not a {d['kind']} target")
        targets[name] = TargetConfig(name=name, kind=d["kind"], source=d["source"], path=str(d.get("path", "")),
                                     endpoint=None if d["kind"] == "delta" else _endpoint(d, where),
                                     schema=check_identifier(d.get("schema", "public")), changelog=changelog,
                                     storage_options=_storage_options(d, where))
    state = raw.get("state") or {}
    storage = raw.get("storage") or {}
    if "redis_url" not in state and state.get("conn_id"):
        c = connection_fields(str(state["conn_id"]), env, "state")
        auth = f":{c['password']}@" if c.get("password") else ""
        state = state | {"redis_url": c.get("url") or
                         f"redis://{auth}{c.get('host', '127.0.0.1')}:{c.get('port', 6379)}/{c.get('database', '0')}"}
    if "redis_url" not in state:
        raise ConfigError("state: 'redis_url' (or 'conn_id') is required")
    if "root" not in storage:
        raise ConfigError("storage: 'root' is required (a local path or a Hadoop-compatible URI)")
    root = _beside(str(storage["root"]), path)
    targets = {n: replace(t, path=_beside(t.path, path)) if t.path else t for n, t in targets.items()}
    return Config(
        sources=sources, targets=targets, redis_url=str(state["redis_url"]),
        state_prefix=str(state.get("prefix", "dblog")), storage_root=root,
        spark=_section(SparkConfig, raw.get("spark"), "spark"),
        dump=_section(DumpConfig, raw.get("dump"), "dump"),
        tail=_section(TailConfig, raw.get("tail"), "tail"), path=path,
        apply=_section(ApplyConfig, raw.get("apply"), "apply"))


def _beside(where: str, config_path: str) -> str:
    """A relative local path (storage root, lake path) is relative to the config file."""
    if "://" not in where and config_path and not os.path.isabs(where):
        return str((Path(config_path).parent / where).resolve())
    return where


def _schema_changes(value: Any, tables: tuple[str, ...], where: str) -> dict:
    try:
        default, per_table = parse_setting(value, tables)
    except ValueError as e:
        raise ConfigError(f"{where}.schema_changes: {e}") from None
    return {"schema_changes": default, "schema_changes_tables": per_table}


def _decoder(d: dict, kind: str, where: str) -> str:
    if kind != "mysql" and "decoder" in d:
        raise ConfigError(f"{where}.decoder: only a mysql source has a binlog decoder to choose")
    return _choice(d.get("decoder", DEFAULT_DECODER), DECODERS, f"{where}.decoder")


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{where} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _storage_options(d: dict, where: str) -> tuple[tuple[str, str], ...]:
    options = d.get("storage_options") or {}
    if options and d["kind"] not in ("delta", "iceberg"):
        raise ConfigError(f"{where}.storage_options: only a delta or iceberg target has them")
    if not isinstance(options, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                                for k, v in options.items()):
        raise ConfigError(f"{where}.storage_options: a mapping of option names to values, not {type(options).__name__}")
    return tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in options.items()))


def _seconds(value: Any, low: float, high: float, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not low <= seconds <= high:   # nan fails too
        raise ConfigError(f"{where} must be a number of seconds from {low} to {high}, not {value!r}")
    return seconds


def load_config(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> Config:
    path = str(path)
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    return parse_config(raw, path, env)


def referenced_conn_ids(path: str | os.PathLike) -> list[str]:
    """The ``conn_id`` names a config file refers to (what the Airflow hook must resolve)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    ids = [d.get("conn_id") for section in ("sources", "targets") for d in (raw.get(section) or {}).values()]
    ids.append((raw.get("state") or {}).get("conn_id"))
    return sorted({str(i) for i in ids if i})
