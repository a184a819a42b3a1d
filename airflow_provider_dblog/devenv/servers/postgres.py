"""The private PostgreSQL 15: logical WAL, trust authentication, run as the postgres user."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .base import MAX_SOCKET_PATH, START_TIMEOUT, PrivateServer, ServerPaths, base_hash
from .processes import HOST, STOP_TIMEOUT, ServerError, is_root, terminate, which

POSTGRES_PORT = 15432
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"
PG_BIN = Path(os.environ.get("DBLOG_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"
# The -c settings CDC depends on; docker/compose.yaml must match them (tests/test_docker_compose.py).
POSTGRES_SETTINGS = ("wal_level=logical", "max_replication_slots=20", "max_wal_senders=20",
                     "fsync=off", "timezone=UTC")

# Where the PostgreSQL files go when the postgres user cannot reach BASE
# (e.g. BASE under /root, which is mode 0700).
_FALLBACK_PARENT = Path("/var/tmp")
_START_ATTEMPTS = 4


@dataclass(frozen=True)
class PostgresPaths(ServerPaths):
    sockdir: Path
    socket_lock: Path  # the unix socket's lock file, left behind by a killed server


class PostgresServer(PrivateServer[PostgresPaths]):
    name = "postgres"
    title = "PostgreSQL"
    init_sentinel = "global/pg_control"

    def paths(self, base: Path) -> PostgresPaths:
        root = _pg_root(base)
        sockdir = root
        if len(str(root / f".s.PGSQL.{self.port}.lock")) > MAX_SOCKET_PATH:
            sockdir = Path("/tmp") / f"dblog-{base_hash(base)}-pgsock"
            _make_pg_dir(sockdir)
        return PostgresPaths(root=root, data=root / "data", pid=root / "data" / "postmaster.pid",
                             log=root / "postgres.log", sockdir=sockdir,
                             socket_lock=sockdir / f".s.PGSQL.{self.port}.lock")

    def url(self, database: str = "postgres", driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{PG_USER}@{HOST}:{self.port}/{database}"

    def details(self, p: PostgresPaths) -> dict:
        return {"user": PG_USER, "password": "", "dbname": "postgres", "datadir": str(p.data),
                "socket_dir": str(p.sockdir), "dsn": f"host={HOST} port={self.port} user={PG_USER} dbname=postgres",
                "jdbc_url": f"jdbc:postgresql://{HOST}:{self.port}/postgres", "jdbc_driver": "org.postgresql.Driver",
                "jdbc_jar": POSTGRES_JDBC_JAR}

    def needle(self, p: PostgresPaths) -> bytes:
        # the postmaster runs as `postgres -D <our datadir> ...`
        return b"\0" + str(p.data).encode() + b"\0"

    def init_command(self, p: PostgresPaths) -> list[str]:
        return _as_pg([pg_bin("initdb"), "-D", str(p.data), "-A", "trust", "-U", PG_USER,
                       "--encoding=UTF8", "--locale=C"])

    def stale_files(self, p: PostgresPaths) -> list[Path]:
        return [p.pid, p.socket_lock]

    def launch(self, p: PostgresPaths) -> int | None:
        opts = " ".join([
            f"-c port={self.port}",
            f"-c listen_addresses={HOST}",
            f"-c unix_socket_directories={shlex.quote(str(p.sockdir))}",
            *(f"-c {setting}" for setting in POSTGRES_SETTINGS),
        ])
        cmd = _as_pg([pg_bin("pg_ctl"), "-D", str(p.data), "-w", "-t", str(int(START_TIMEOUT)),
                      "-l", str(p.log), "-o", opts, "start"])
        for attempt in range(1, _START_ATTEMPTS + 1):
            res = subprocess.run(cmd, cwd=p.root, capture_output=True, text=True, start_new_session=True,
                                 check=False, timeout=START_TIMEOUT + 30)
            if res.returncode == 0 or attempt == _START_ATTEMPTS:
                break
            # After a crash (kill -9), orphaned backends may still hold the shared
            # memory / lock files for a moment: retry shortly.
            time.sleep(1.5)
            if not self.running_pid(p):
                self.remove_stale_files(p)
        if res.returncode != 0:
            raise ServerError(
                f"pg_ctl start failed (exit {res.returncode}): {res.stdout.strip()} {res.stderr.strip()}\n"
                f"{self.logs(p)}"
            )
        return self.running_pid(p)  # pg_ctl -w returns once the postmaster wrote its pid file

    def probe(self, p: PostgresPaths) -> str | None:
        import psycopg2

        try:
            psycopg2.connect(host=HOST, port=self.port, user=PG_USER, dbname="postgres", connect_timeout=2).close()
        except psycopg2.OperationalError as exc:
            return str(exc).strip()
        return None

    def shut_down(self, p: PostgresPaths, pid: int) -> None:
        subprocess.run(
            _as_pg([pg_bin("pg_ctl"), "-D", str(p.data), "-m", "fast", "-w", "-t", "60", "stop"]),
            cwd=p.root,
            capture_output=True,
            check=False,
            timeout=STOP_TIMEOUT + 30,
        )
        terminate(pid, self.needle(p))


def pg_bin(name: str) -> str:
    path = PG_BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ServerError(f"{path} not found; install postgresql-15 (bootstrap.sh does)")
    return str(path)


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
    """*cmd* run as the postgres user (PostgreSQL refuses to run as root)."""
    if is_root():
        return [which("runuser"), "-u", PG_USER, "--", *cmd]
    return cmd


def _make_pg_dir(path: Path) -> bool:
    """Create *path* for the postgres user; True if that user can write into it."""
    path.mkdir(parents=True, exist_ok=True)
    if not is_root():
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
    fallback = _FALLBACK_PARENT / f"dblog-pg-{base_hash(base)}"
    if not _make_pg_dir(fallback):
        raise ServerError(
            f"user {PG_USER} can neither write {preferred} nor {fallback}; "
            "set DBLOG_LOCAL_DIR to a directory every user can traverse"
        )
    record.write_text(f"{fallback}\n")
    return fallback


POSTGRES = PostgresServer(POSTGRES_PORT)


def postgres_url(database: str = "postgres", driver: str = "psycopg2") -> str:
    return POSTGRES.url(database, driver)
