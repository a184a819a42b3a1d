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

import os
import select
import time

import psycopg2
import psycopg2.extras

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources.postgres import lsn_to_int

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
        The baseline's own slot is created here, before the writes, so both read the
        same retained WAL from the same start; bare_read drops it."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.bare_slot,))
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

    def _drop_bare_slot(self) -> None:
        conn = self.connect(None)
        try:
            with conn.cursor() as cur:
                self._drop_slots(cur, "slot_name = %s", (self.bare_slot,))
        finally:
            conn.close()
