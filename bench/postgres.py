"""The PostgreSQL BenchSource: the private PostgreSQL 15 of the dev environment
(wal_level=logical), one database ``bench_<run_id>`` per run.

Replication slots are cluster-wide, so every Env gets its own slot (and
publication, named alike) derived from its watermark namespace instead of the
engine's default ``dblog_src``: phases never share a slot, and nothing collides
with other runs or tests on the same server. The engine's tail creates them
(``prepare_log``); the tail phase calls it before pre-writing its changes so the
slot retains them. Seeded rows are written before any slot of the run exists, so
no slot ever decodes them.
"""
from __future__ import annotations

import glob
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time

import psycopg2
import psycopg2.extras

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources.postgres import lsn_to_int

from .sources import finish

HOST = os.environ.get("DBLOG_BENCH_PG_HOST", "127.0.0.1")
PORT = int(os.environ.get("DBLOG_BENCH_PG_PORT", "15432"))
USER = os.environ.get("DBLOG_BENCH_PG_USER", "postgres")
PASSWORD = os.environ.get("DBLOG_BENCH_PG_PASSWORD", "")
SCHEMA = "public"


class PostgresBench:
    kind = "postgres"

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.db = f"bench_{run_id}"
        self.namespaces: list[str] = []
        self.bare_slot = f"bench_{run_id}_bare"   # the baseline reader's own slot
        # pg_recvlogical's: one timed (output to /dev/null), one whose output is counted
        self.recv_slots = (f"bench_{run_id}_recv", f"bench_{run_id}_recvcount")

    # -- connections -------------------------------------------------------------
    def connect(self, db: str | None = "") -> psycopg2.extensions.connection:
        conn = psycopg2.connect(host=HOST, port=PORT, user=USER, password=PASSWORD or None,
                                dbname=self.db if db == "" else (db or "postgres"),
                                options="-c TimeZone=UTC")
        conn.autocommit = True
        return conn

    def _exec(self, *stmts, db: str | None = "") -> None:
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                for s in stmts:
                    if isinstance(s, tuple):
                        cur.execute(*s)
                    else:
                        cur.execute(s)
        finally:
            conn.close()

    def _query(self, query: str, args=(), db: str | None = "") -> list[tuple]:
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    @staticmethod
    def slot_of(namespace: str) -> str:
        """The slot (and publication) name of an Env, from its watermark namespace
        ``bench_<run>_<phase>_wm``: unique per run and phase, [a-z0-9_], < 64 chars."""
        return namespace.removesuffix("_wm")[:63]

    def _drop_slots(self, cur, where: str, args: tuple) -> None:
        """Terminate the walsenders of the matching slots, wait for them to let go,
        then drop the slots (an active slot cannot be dropped)."""
        cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    f"WHERE {where} AND active_pid IS NOT NULL", args)
        slots = []
        for _ in range(100):
            cur.execute(f"SELECT slot_name, active_pid FROM pg_replication_slots WHERE {where}", args)
            slots = cur.fetchall()
            if not any(pid for _, pid in slots):
                break
            time.sleep(0.1)
        for slot, _ in slots:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

    # -- the database ------------------------------------------------------------
    def setup(self) -> None:
        self._exec(f'CREATE DATABASE "{self.db}"', db=None)

    def teardown(self) -> None:
        # the slots of the database first: DROP DATABASE fails while one exists
        conn = self.connect(None)
        try:
            with conn.cursor() as cur:
                self._drop_slots(cur, "database = %s", (self.db,))
                cur.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
        finally:
            conn.close()

    def drop_namespace(self, name: str) -> None:
        """An Env's leftovers in the source: its slot, its publication, the schema of
        its watermark table."""
        slot = self.slot_of(name)
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                self._drop_slots(cur, "slot_name = %s", (slot,))
                cur.execute(f'DROP PUBLICATION IF EXISTS "{slot}"')
                cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            conn.close()

    def qualified(self, table: str) -> str:
        return f"{SCHEMA}.{table}"

    def source_config(self, tables: list[str], server_id: int, wm_namespace: str) -> dict:
        self.namespaces.append(wm_namespace)
        slot = self.slot_of(wm_namespace)
        return {"kind": "postgres", "host": HOST, "port": PORT, "user": USER, "password": PASSWORD,
                "database": self.db, "watermark_namespace": wm_namespace,
                "slot": slot, "publication": slot,
                "tables": [self.qualified(t) for t in tables]}

    def create_table(self, table: str) -> None:
        # REPLICA IDENTITY FULL: the engine needs the old row of updates and deletes
        # (PostgresSource.check, which `dblog tail` runs, fails without it)
        self._exec(f"""CREATE TABLE "{table}" (
            id BIGINT PRIMARY KEY, wseq BIGINT NOT NULL, v INT NOT NULL,
            amount NUMERIC(12,2) NOT NULL, note VARCHAR(64), at TIMESTAMP(6) NOT NULL)""",
                   f'ALTER TABLE "{table}" REPLICA IDENTITY FULL')

    def seed(self, table: str, rows: int) -> None:
        # generate_series server-side, in batches that bound each transaction. The
        # run's slots are created later (by the tails), so no slot decodes these rows.
        # VACUUM ANALYZE afterwards: hint bits set and statistics in place, so the
        # first reader of the table (the dump baseline) does not pay for them
        step = 500_000
        stmts = [f"""INSERT INTO "{table}" SELECT g, 0, g % 1000, round((g % 100000) / 7.0, 2),
                     'row ' || g, timestamp '2024-01-01' + g * interval '1 second'
                     FROM generate_series({lo}, {min(rows, lo + step - 1)}) AS g"""
                 for lo in range(1, rows + 1, step)]
        self._exec(*stmts, f'VACUUM ANALYZE "{table}"')

    def insert_sql(self, table: str) -> str:
        return (f'INSERT INTO "{SCHEMA}"."{table}" (id, wseq, v, amount, note, at) '
                "VALUES (%s, %s, 1, 9.99, 'insert', clock_timestamp())")

    def update_sql(self, table: str) -> str:
        return (f'UPDATE "{SCHEMA}"."{table}" SET wseq = %s, v = v + 1, amount = amount + 0.01, '
                "at = clock_timestamp() WHERE id = %s")

    def log_end(self) -> dict:
        (lsn,), = self._query("SELECT pg_current_wal_lsn()::text")
        return {"lsn": str(lsn)}

    # -- the tail phase --------------------------------------------------------------
    def write_events(self, table: str, n: int, txn_rows: int) -> tuple[Position, dict]:
        """Pre-write ``n`` row changes (half inserts, half updates) in transactions of
        ``txn_rows`` rows. Returns the WAL position before them as a Position and as
        the engine's resume dict ({"lsn": "X/Y"}, what a PostgreSQL checkpoint holds).

        The engine's slots must exist already (phases.tail runs prepare_log first).
        The baselines' own slots are created here, before the writes, so all read the
        same retained WAL from the same start; bare_read and physical_read drop them."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for slot in (self.bare_slot, *self.recv_slots):
                    cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            start = self.log_end()
            half = n // 2
            with conn.cursor() as cur:
                for lo in range(1, half + 1, txn_rows):
                    hi = min(half, lo + txn_rows - 1)
                    cur.execute(f"""INSERT INTO "{table}" SELECT g, g, g % 1000, round(g / 7.0, 2),
                                    'row ' || g, clock_timestamp() FROM generate_series({lo}, {hi}) AS g""")
                for lo in range(1, n - half + 1, txn_rows):
                    hi = min(n - half, lo + txn_rows - 1)
                    cur.execute(f'UPDATE "{table}" SET wseq = wseq + {n}, v = v + 1, at = clock_timestamp() '
                                f"WHERE id BETWEEN {lo} AND {hi}")
        finally:
            conn.close()
        return Position(0, lsn_to_int(start["lsn"]), 0), start

    def bare_read(self, resume: dict, n_events: int, tables: list[str], wm_namespace: str) -> dict:
        """The baseline: a bare psycopg2 LogicalReplicationConnection reading pgoutput
        (protocol 1, the engine's publication of this Env, the engine's session
        settings) from the same start, decoding every message and every value with
        the engine's pgoutput decoder (pgoutput.decode + RelationCache.tuple_change:
        text -> Python value by type OID) and doing nothing else.

        It reads its own slot (made by write_events before the writes), never the
        engine's, and sends no feedback: the engine's slot is untouched whatever the
        order of the two reads. The slot is dropped at the end."""
        from airflow_provider_dblog.engine.sources.postgres.pgoutput import decode
        from airflow_provider_dblog.engine.sources.postgres.pgoutput_messages import Delete, Insert, Relation, Update
        from airflow_provider_dblog.engine.sources.postgres.relation_cache import RelationCache
        from airflow_provider_dblog.engine.sources.postgres.stream import REPLICATION_OPTIONS
        publication = self.slot_of(wm_namespace)
        wanted = {(SCHEMA, t) for t in tables}
        t0 = time.monotonic()
        conn = psycopg2.connect(host=HOST, port=PORT, user=USER, password=PASSWORD or None,
                                dbname=self.db, options=REPLICATION_OPTIONS,
                                connection_factory=psycopg2.extras.LogicalReplicationConnection)
        seen = 0
        try:
            cur = conn.cursor()
            cur.start_replication(slot_name=self.bare_slot, decode=False, start_lsn=lsn_to_int(resume["lsn"]),
                                  options={"proto_version": "1", "publication_names": publication})
            rels = RelationCache()
            ours: set[int] = set()
            last_msg = time.monotonic()
            while seen < n_events:
                msg = cur.read_message()
                if msg is None:
                    if time.monotonic() - last_msg > 60:
                        raise RuntimeError(f"bare_read: nothing from slot {self.bare_slot} for 60 s "
                                           f"after {seen} of {n_events} row changes")
                    select.select([cur], [], [], 0.5)
                    continue
                last_msg = time.monotonic()
                m = decode(msg.payload)
                if isinstance(m, (Insert, Update, Delete)):
                    rels.tuple_change(m)   # every column's text -> value
                    if m.relation_oid in ours:
                        seen += 1
                else:
                    rels.add(m)
                    if isinstance(m, Relation) and (m.namespace, m.name) in wanted:
                        ours.add(m.oid)
        finally:
            conn.close()
            secs = time.monotonic() - t0
            self._drop_bare_slot()
        return {"events": seen, "seconds": round(secs, 3), "events_per_s": round(seen / secs, 1)}

    def _drop_bare_slot(self, *slots: str) -> None:
        conn = self.connect(None)
        try:
            with conn.cursor() as cur:
                for slot in slots or (self.bare_slot,):
                    self._drop_slots(cur, "slot_name = %s", (slot,))
        finally:
            conn.close()

    def physical_read(self, resume: dict, end: dict, n_events: int, tables: list[str],
                      wm_namespace: str) -> dict:
        """The C baseline: ``pg_recvlogical`` (shipped with PostgreSQL) streaming pgoutput
        protocol 1 on the Env's publication from its own slot (made by write_events
        before the writes), from ``resume`` to ``--endpos`` = ``end`` (the WAL head
        after the writes), with the engine's session settings (PGOPTIONS). The server
        decodes and formats every value either way; the client only receives and
        writes the messages. A first run on one slot writes a file whose row changes
        of ``tables`` are counted (must equal ``n_events``); the timed run on the other
        writes to /dev/null. Both slots are dropped at the end."""
        from airflow_provider_dblog.engine.sources.postgres.stream import REPLICATION_OPTIONS
        tool = _pg_tool("pg_recvlogical")
        env = dict(os.environ, PGOPTIONS=REPLICATION_OPTIONS)
        env.pop("PGPASSWORD", None)
        if PASSWORD:
            env["PGPASSWORD"] = PASSWORD
        timed_slot, count_slot = self.recv_slots

        def cmd(slot: str, out: str) -> list[str]:
            return [tool, f"--host={HOST}", f"--port={PORT}", f"--username={USER}", f"--dbname={self.db}",
                    "--no-password", f"--slot={slot}", "--start", f"--startpos={resume['lsn']}",
                    f"--endpos={end['lsn']}", "--no-loop", "-o", "proto_version=1",
                    "-o", f"publication_names={self.slot_of(wm_namespace)}", f"--file={out}"]
        try:
            with tempfile.NamedTemporaryFile(suffix=".pgoutput") as out, tempfile.TemporaryFile() as err:
                c = cmd(count_slot, out.name)
                finish(subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=err, env=env), c, err)
                counted = count_changes(out.read(), {(SCHEMA, t) for t in tables})
            if counted != n_events:
                raise RuntimeError(f"physical_read: {tool} received {counted} row changes of {tables} "
                                   f"in {resume['lsn']} .. {end['lsn']}, not the {n_events} written")
            c = cmd(timed_slot, "/dev/null")
            t0 = time.monotonic()
            with tempfile.TemporaryFile() as err:
                finish(subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=err, env=env), c, err)
            secs = time.monotonic() - t0
        finally:
            self._drop_bare_slot(*self.recv_slots)
        version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
        return {"tool": "pg_recvlogical", "version": version, "events": counted,
                "seconds": round(secs, 3), "events_per_s": round(counted / secs, 1)}


def _pg_tool(name: str) -> str:
    """A PostgreSQL client program: the newest /usr/lib/postgresql/<v>/bin (Debian), else PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    tool = found[-1] if found else shutil.which(name)
    if not tool:
        raise RuntimeError(f"no {name} under /usr/lib/postgresql/*/bin nor on PATH")
    return tool


def _pgoutput_frames(buf: bytes):
    """The messages of a pg_recvlogical output file: each pgoutput payload followed by a
    newline. Payloads are binary, so each one's length is read from its own structure
    (protocol 1: B C O R Y I U D T)."""
    pos = 0

    def cstr(p: int) -> int:
        return buf.index(b"\0", p) + 1

    def tup(p: int) -> int:
        (n,), p = struct.unpack_from(">h", buf, p), p + 2
        for _ in range(n):
            kind, p = buf[p:p + 1], p + 1
            if kind in (b"t", b"b"):
                p += 4 + struct.unpack_from(">i", buf, p)[0]
        return p
    while pos < len(buf):
        kind, p = buf[pos:pos + 1], pos + 1
        if kind == b"B":
            p += 20
        elif kind == b"C":
            p += 25
        elif kind == b"O":
            p = cstr(p + 8)
        elif kind == b"Y":
            p = cstr(cstr(p + 4))
        elif kind == b"R":
            p = cstr(cstr(p + 4)) + 1
            (n,), p = struct.unpack_from(">h", buf, p), p + 2
            for _ in range(n):
                p = cstr(p + 1) + 8
        elif kind == b"I":
            p = tup(p + 5)
        elif kind in (b"U", b"D"):
            p += 4
            if buf[p:p + 1] in (b"K", b"O"):
                p = tup(p + 1)
            if kind == b"U":
                p = tup(p + 1)  # the new tuple, after its "N"
        elif kind == b"T":
            p += 5 + 4 * struct.unpack_from(">i", buf, p)[0]
        else:
            raise ValueError(f"pg_recvlogical output: unknown message {kind!r} at byte {pos}")
        if buf[p:p + 1] != b"\n":
            raise ValueError(f"pg_recvlogical output: no newline after the {kind!r} message at byte {pos}")
        yield buf[pos:p]
        pos = p + 1


def count_changes(buf: bytes, wanted: set[tuple[str, str]]) -> int:
    """Row changes (Insert, Update, Delete) of the ``wanted`` (schema, table)s in a
    pg_recvlogical output file; every message is decoded by the engine's decoder."""
    from airflow_provider_dblog.engine.sources.postgres.pgoutput import decode
    from airflow_provider_dblog.engine.sources.postgres.pgoutput_messages import Delete, Insert, Relation, Update
    ours: set[int] = set()
    n = 0
    for frame in _pgoutput_frames(buf):
        m = decode(frame)
        if isinstance(m, Relation) and (m.namespace, m.name) in wanted:
            ours.add(m.oid)
        elif isinstance(m, (Insert, Update, Delete)) and m.relation_oid in ours:
            n += 1
    return n
