"""The MySQL/MariaDB BenchSource: the private MariaDB of the dev environment."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pymysql

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources.mysql import binlog_file_number

from .sources import finish

HOST = os.environ.get("DBLOG_BENCH_MYSQL_HOST", "127.0.0.1")
PORT = int(os.environ.get("DBLOG_BENCH_MYSQL_PORT", "13306"))
USER = os.environ.get("DBLOG_BENCH_MYSQL_USER", "root")
PASSWORD = os.environ.get("DBLOG_BENCH_MYSQL_PASSWORD", "")


class MySQLBench:
    kind = "mysql"

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.db = f"bench_{run_id}"
        self.namespaces: list[str] = []

    def connect(self, db: str | None = "") -> pymysql.connections.Connection:
        return pymysql.connect(host=HOST, port=PORT, user=USER, password=PASSWORD,
                               database=self.db if db == "" else db, autocommit=True)

    def _exec(self, *stmts: str, db: str | None = "", no_binlog: bool = False) -> None:
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                if no_binlog:  # seeded rows are state, not history: keep them out of the binlog
                    cur.execute("SET SESSION sql_log_bin = 0")
                for s in stmts:
                    cur.execute(s)
        finally:
            conn.close()

    def setup(self) -> None:
        self._exec(f"CREATE DATABASE `{self.db}`", db=None)

    def teardown(self) -> None:
        self._exec(f"DROP DATABASE IF EXISTS `{self.db}`",
                   *[f"DROP DATABASE IF EXISTS `{n}`" for n in self.namespaces], db=None)

    def drop_namespace(self, name: str) -> None:
        self._exec(f"DROP DATABASE IF EXISTS `{name}`", db=None)

    def qualified(self, table: str) -> str:
        return f"{self.db}.{table}"

    def source_config(self, tables: list[str], server_id: int, wm_namespace: str) -> dict:
        self.namespaces.append(wm_namespace)
        return {"kind": "mysql", "host": HOST, "port": PORT, "user": USER, "password": PASSWORD,
                "server_id": server_id, "watermark_namespace": wm_namespace,
                "tables": [self.qualified(t) for t in tables]}

    def create_table(self, table: str) -> None:
        self._exec(f"""CREATE TABLE `{table}` (
            id BIGINT PRIMARY KEY, wseq BIGINT NOT NULL, v INT NOT NULL,
            amount DECIMAL(12,2) NOT NULL, note VARCHAR(64), at DATETIME(6) NOT NULL) ENGINE=InnoDB""")

    def seed(self, table: str, rows: int) -> None:
        # MariaDB's sequence engine generates the rows server-side; batches keep
        # each transaction (and the undo log) bounded
        step = 500_000
        stmts = [f"""INSERT INTO `{table}` SELECT seq, 0, seq % 1000, ROUND((seq % 100000) / 7, 2),
                     CONCAT('row ', seq), TIMESTAMP('2024-01-01') + INTERVAL seq SECOND
                     FROM seq_{lo}_to_{min(rows, lo + step - 1)}"""
                 for lo in range(1, rows + 1, step)]
        self._exec(*stmts, no_binlog=True)

    def insert_sql(self, table: str) -> str:
        return (f"INSERT INTO `{self.db}`.`{table}` (id, wseq, v, amount, note, at) "
                "VALUES (%s, %s, 1, 9.99, 'insert', NOW(6))")

    def update_sql(self, table: str) -> str:
        return (f"UPDATE `{self.db}`.`{table}` SET wseq = %s, v = v + 1, amount = amount + 0.01, "
                "at = NOW(6) WHERE id = %s")

    def log_end(self) -> dict:
        conn = self.connect(None)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                file, pos = cur.fetchone()[:2]
        finally:
            conn.close()
        return {"file": str(file), "pos": int(pos)}

    def write_events(self, table: str, n: int, txn_rows: int) -> tuple[Position, dict]:
        """Pre-write ``n`` row changes (half inserts, half updates) in transactions of
        ``txn_rows`` rows, like an application's small transactions. Returns the log
        position before them, as a Position and as the reader's resume dict."""
        start = self.log_end()
        conn = self.connect()
        half = n // 2
        try:
            with conn.cursor() as cur:
                for lo in range(1, half + 1, txn_rows):
                    hi = min(half, lo + txn_rows - 1)
                    cur.execute(f"""INSERT INTO `{table}` SELECT seq, seq, seq % 1000, ROUND(seq / 7, 2),
                                    CONCAT('row ', seq), NOW(6) FROM seq_{lo}_to_{hi}""")
                for lo in range(1, n - half + 1, txn_rows):
                    hi = min(n - half, lo + txn_rows - 1)
                    cur.execute(f"UPDATE `{table}` SET wseq = wseq + {n}, v = v + 1, at = NOW(6) "
                                f"WHERE id BETWEEN {lo} AND {hi}")
        finally:
            conn.close()
        return Position(binlog_file_number(start["file"]), start["pos"], 0), start

    def bare_read(self, resume: dict, n_events: int, tables: list[str], wm_namespace: str) -> dict:
        """The baseline: mysql-replication set up exactly as the engine's reader
        (same event and table filters), decoding every row and doing nothing else."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (HeartbeatLogEvent, QueryEvent, RotateEvent,
                                              XAPrepareEvent, XidEvent)
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        t0 = time.monotonic()
        stream = BinLogStreamReader(
            connection_settings={"host": HOST, "port": PORT, "user": USER, "password": PASSWORD},
            server_id=7_000_000 + os.getpid() % 100_000, log_file=resume["file"], log_pos=resume["pos"],
            resume_stream=True, blocking=True, slave_heartbeat=0.5, is_mariadb=False,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent,
                         RotateEvent, HeartbeatLogEvent, XAPrepareEvent],
            only_schemas=[self.db, wm_namespace], only_tables=list(tables) + ["watermark"],
            enable_logging=False)
        seen = 0
        try:
            for ev in stream:
                if isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    seen += len(ev.rows)  # .rows decodes every row image
                    if seen >= n_events:
                        break
        finally:
            stream.close()
        secs = time.monotonic() - t0
        return {"events": seen, "seconds": round(secs, 3), "events_per_s": round(seen / secs, 1)}

    # -- the physical limit: MariaDB's own C decoder over the same range ----------------
    def _log_files(self, first: str, last: str) -> list[str]:
        conn = self.connect(None)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                names = [str(r[0]) for r in cur.fetchall()]
        finally:
            conn.close()
        return names[names.index(first):names.index(last) + 1]

    def physical_read(self, resume: dict, end: dict, n_events: int, tables: list[str],
                      wm_namespace: str) -> dict:
        """The C baseline: ``mariadb-binlog --read-from-remote-server -v
        --base64-output=DECODE-ROWS`` (MariaDB's own decoder: every row image decoded
        and printed as pseudo-SQL) over the pre-written range, from ``resume`` to
        ``end`` (the binlog head after the writes), rows of the bench database only
        (``--database``, like the bare loop's only_schemas). A range over several files
        is read one process per file (start position on the first, stop position on the
        last: each process's options apply to its own file). A first run's output is
        parsed to count the row changes (must equal ``n_events``); the timed second
        run writes to /dev/null. The password goes in MYSQL_PWD, never on the line."""
        tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
        if not tool:
            raise RuntimeError("physical_read: no mariadb-binlog nor mysqlbinlog on PATH "
                               "(Debian: apt-get install mariadb-client)")
        files = self._log_files(resume["file"], end["file"])
        cmds = [[tool, "--read-from-remote-server", f"--host={HOST}", f"--port={PORT}", f"--user={USER}",
                 "-v", "--base64-output=DECODE-ROWS", f"--database={self.db}"]
                + ([f"--start-position={resume['pos']}"] if i == 0 else [])
                + ([f"--stop-position={end['pos']}"] if i == len(files) - 1 else []) + [f]
                for i, f in enumerate(files)]
        env = dict(os.environ)
        env.pop("MYSQL_PWD", None)
        if PASSWORD:
            env["MYSQL_PWD"] = PASSWORD
        counted = 0
        for cmd in cmds:
            err = tempfile.TemporaryFile()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
            for line in proc.stdout:
                if line.startswith((b"### INSERT INTO ", b"### UPDATE ", b"### DELETE FROM ")):
                    counted += 1
            finish(proc, cmd, err)
        if counted != n_events:
            raise RuntimeError(f"physical_read: {tool} decoded {counted} row changes of {self.db} in "
                               f"{resume} .. {end}, not the {n_events} written")
        t0 = time.monotonic()
        for cmd in cmds:
            err = tempfile.TemporaryFile()
            finish(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env), cmd, err)
        secs = time.monotonic() - t0
        version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
        return {"tool": os.path.basename(tool), "version": version, "files": files, "events": counted,
                "seconds": round(secs, 3), "events_per_s": round(counted / secs, 1)}

