"""The private MariaDB: ROW/FULL binlog, root with an empty password over TCP."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .base import MAX_SOCKET_PATH, PrivateServer, ServerPaths, base_hash
from .processes import HOST, current_user, is_root, spawn_detached, tail, which

MARIADB_PORT = 13306
MARIADB_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"

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

# 1045 access denied, 1130 host not allowed, 1698 unix_socket-only root
_ROOT_REFUSED = (1045, 1130, 1698)


@dataclass(frozen=True)
class MariaDBPaths(ServerPaths):
    socket: Path
    out: Path  # mariadbd's own stdout/stderr: what it says before its error log opens

    @property
    def binlog(self) -> Path:
        return self.data / "binlog"


class MariaDBServer(PrivateServer[MariaDBPaths]):
    name = "mariadb"
    title = "MariaDB"
    init_sentinel = "mysql/global_priv.frm"

    def paths(self, base: Path) -> MariaDBPaths:
        root = base / "mariadb"
        sock = root / "mariadbd.sock"
        if len(str(sock)) > MAX_SOCKET_PATH:
            sock = Path("/tmp") / f"dblog-{base_hash(base)}-mariadbd.sock"
        return MariaDBPaths(root=root, data=root / "data", pid=root / "mariadbd.pid", log=root / "mariadbd.err",
                            socket=sock, out=root / "mariadbd.out")

    def url(self, database: str = "", driver: str = "pymysql") -> str:
        return f"mysql+{driver}://root@{HOST}:{self.port}/{database}"

    def details(self, p: MariaDBPaths) -> dict:
        return {"user": "root", "password": "", "socket": str(p.socket), "datadir": str(p.data),
                "binlog_basename": str(p.binlog), "jdbc_url": f"jdbc:mysql://{HOST}:{self.port}/",
                "jdbc_driver": "org.mariadb.jdbc.Driver", "jdbc_jar": MARIADB_JDBC_JAR}

    def needle(self, p: MariaDBPaths) -> bytes:
        return f"--datadir={p.data}".encode()

    def init_command(self, p: MariaDBPaths) -> list[str]:
        p.data.mkdir(parents=True, exist_ok=True)
        return [
            which("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={p.data}",
            "--user=root" if is_root() else f"--user={current_user()}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]

    def command(self, p: MariaDBPaths) -> list[str]:
        """The mariadbd command line: the host-specific flags, then MARIADB_SETTINGS."""
        cmd = [which("mariadbd"), "--no-defaults"]
        if is_root():
            cmd.append("--user=root")
        cmd += [
            f"--datadir={p.data}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            f"--socket={p.socket}",
            f"--pid-file={p.pid}",
            f"--log-error={p.log}",
            f"--log-bin={p.binlog}",
            "--skip-name-resolve",
            *MARIADB_SETTINGS,
        ]
        return cmd

    def stale_files(self, p: MariaDBPaths) -> list[Path]:
        return [p.pid, p.socket]

    def launch(self, p: MariaDBPaths) -> int:
        return spawn_detached(self.command(p), p.out, p.root)

    def probe(self, p: MariaDBPaths) -> str | None:
        error = self._root_refusal()
        if error and error.args and error.args[0] in _ROOT_REFUSED and p.socket.exists():
            _allow_root_over_tcp(p)
            error = self._root_refusal()
        return None if error is None else f"as root with an empty password: {error}"

    def _root_refusal(self) -> Exception | None:
        """Why root cannot connect over TCP, None if it can."""
        import pymysql

        try:
            pymysql.connect(host=HOST, port=self.port, user="root", password="", connect_timeout=2).close()
        except pymysql.err.OperationalError as exc:
            return exc
        return None

    def logs(self, p: MariaDBPaths) -> str:
        return f"{super().logs(p)}\n--- {p.out}:\n{tail(p.out, 10)}"


def _allow_root_over_tcp(p: MariaDBPaths) -> None:
    """Make root@127.0.0.1 exist with an empty password (via the unix socket)."""
    import pymysql

    conn = pymysql.connect(unix_socket=str(p.socket), user="root", password="", connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''")
            cur.execute("ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY ''")
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
            cur.execute("FLUSH PRIVILEGES")
        conn.commit()
    finally:
        conn.close()


MARIADB = MariaDBServer(MARIADB_PORT)


def mariadb_url(database: str = "", driver: str = "pymysql") -> str:
    return MARIADB.url(database, driver)
