"""A schema-change fuzzer (issue 27, item 5): random DDL sequences on a real source, with the
real tail, dump and apply, checked table by table against the source at the end.

    python -m bench.schema_fuzz --source mariadb --seed 1 --sequences 10 --statements 30

Each sequence: fresh source namespace, target database, Redis prefix and storage; a few tables
with edge-value rows, dumped in-process; then ``--statements`` steps drawn from a grammar of
DDL kinds (``kinds(source)``) interleaved with row writes, the tail stopped and restarted at
random (so it often reads behind the catalog) and dumps of a table running across the changes.
At the end: drain, apply (in-process), and every table is classified:

* EQUAL: the target equals the source row for row, column for column (engine/verify.py);
* QUARANTINED (then EQUAL): quarantined or held with a message; a full dump releases it, and
  after it the target equals the source;
* DIVERGED: silently different (not quarantined, not held), or still different after release;
* ERROR: the tail or the apply raised (every table of the source stopped).

A statement the source refuses (a narrowing over existing values, a duplicate key) is only
counted as refused: the fuzzer explores, the source is the judge of what is valid.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import psycopg2
import pymysql
import yaml

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.store import EventStore
from airflow_provider_dblog.engine.tail import Tail
from airflow_provider_dblog.engine.targets import target_table_name
from airflow_provider_dblog.engine.verify import compare_source_target

MARIADB_PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", 13306))
POSTGRES_PORT = int(os.environ.get("DBLOG_TEST_POSTGRES_PORT", 15432))
REDIS_PORT = int(os.environ.get("DBLOG_TEST_REDIS_PORT", 16379))

# statement kinds with a known, reported divergence: {source: {kind: reason}}; the CI test
# leaves them out (--exclude-known), the long run keeps them in
KNOWN_DIVERGENT: dict[str, dict[str, str]] = {
    "mariadb": {},
    "postgres": {},
}

EQUAL, RELEASED, DIVERGED, ERROR = "EQUAL", "QUARANTINED-THEN-EQUAL", "DIVERGED", "ERROR"


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _wait(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(poll)


# -- the source database of one sequence ------------------------------------------------------

class Refused(Exception):
    """The source refused a statement (not a finding)."""


class MariaSrc:
    kind, label = "mysql", "mariadb"

    def __init__(self) -> None:
        self.name = _unique("fz")
        self.conn = pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="",
                                    autocommit=True, charset="utf8mb4")
        self.execute(f"CREATE DATABASE `{self.name}`")
        self.conn.select_db(self.name)
        self.execute("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'")

    def execute(self, sql: str, args=None) -> list[tuple]:
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        except (pymysql.err.ProgrammingError, pymysql.err.OperationalError, pymysql.err.IntegrityError,
                pymysql.err.DataError, pymysql.err.InternalError, pymysql.err.NotSupportedError) as e:
            raise Refused(str(e)) from None

    def source_config(self, tables: list[str], wm: str) -> dict:
        return {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root", "password": "",
                "server_id": 5000 + random.randint(0, 4_000_000), "watermark_namespace": wm,
                "tables": [f"{self.name}.{t}" for t in tables]}

    def columns(self, table: str) -> list[dict]:
        rows = self.execute(
            "SELECT column_name, data_type, column_type, numeric_precision, numeric_scale, "
            "character_maximum_length, is_nullable, extra, character_set_name, column_key "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
            "ORDER BY ordinal_position", (self.name, table))
        return [dict(name=r[0], type=r[1].lower(), full=r[2].lower(), prec=r[3], scale=r[4], length=r[5],
                     nullable=r[6] == "YES", generated="GENERATED" in (r[7] or "").upper(),
                     invisible="INVISIBLE" in (r[7] or "").upper(), charset=r[8], key=r[9] == "PRI")
                for r in rows]

    def exists(self, table: str) -> bool:
        return bool(self.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s "
                                 "AND table_name = %s", (self.name, table)))

    def partitions(self, table: str) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self.execute(
            "SELECT partition_name, partition_description FROM information_schema.partitions "
            "WHERE table_schema = %s AND table_name = %s AND partition_name IS NOT NULL "
            "ORDER BY partition_ordinal_position", (self.name, table))]

    def q(self, ident: str) -> str:
        return f"`{ident}`"

    def close(self, wm: str) -> None:
        for ns in (self.name, wm):
            with contextlib.suppress(Exception):
                self.execute(f"DROP DATABASE IF EXISTS `{ns}`")
        self.conn.close()


class PgSrc:
    kind, label = "postgres", "postgres"

    def __init__(self) -> None:
        self.database, self.name = _unique("fzsrc"), "app"
        with contextlib.closing(_pg()) as c, c.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.database}"')
        self.conn = _pg(self.database)
        self.execute(f'CREATE SCHEMA "{self.name}"')
        self.execute(f'SET search_path TO "{self.name}"')

    def execute(self, sql: str, args=None) -> list[tuple]:
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall()) if cur.description else []
        except (psycopg2.ProgrammingError, psycopg2.DataError, psycopg2.IntegrityError,
                psycopg2.NotSupportedError, psycopg2.errors.ObjectInUse, psycopg2.errors.ObjectNotInPrerequisiteState,
                psycopg2.errors.FeatureNotSupported, psycopg2.InternalError) as e:
            raise Refused(str(e).strip()) from None

    def source_config(self, tables: list[str], wm: str) -> dict:
        return {"kind": "postgres", "host": "127.0.0.1", "port": POSTGRES_PORT, "user": "postgres",
                "password": "", "database": self.database, "watermark_namespace": wm,
                "slot": _unique("slot"), "publication": _unique("pub"),
                "tables": [f"{self.name}.{t}" for t in tables]}

    def columns(self, table: str) -> list[dict]:
        rows = self.execute(
            "SELECT c.column_name, c.data_type, format_type(a.atttypid, a.atttypmod), c.numeric_precision, "
            "c.numeric_scale, c.character_maximum_length, c.is_nullable, c.is_generated, c.udt_name, "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary "
            "AND a.attnum = ANY(i.indkey)) "
            "FROM information_schema.columns c JOIN pg_attribute a ON a.attrelid = to_regclass(%s) "
            "AND a.attname = c.column_name WHERE c.table_schema = %s AND c.table_name = %s "
            "ORDER BY c.ordinal_position", (f'"{self.name}"."{table}"', self.name, table))
        return [dict(name=r[0], type=("enum" if r[1] == "USER-DEFINED" else r[1].lower()), full=r[2],
                     prec=r[3], scale=r[4], length=r[5], nullable=r[6] == "YES", generated=r[7] == "ALWAYS",
                     invisible=False, charset=None, udt=r[8], key=r[9])
                for r in rows]

    def enum_labels(self, udt: str) -> list[str]:
        return [r[0] for r in self.execute(
            "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid WHERE t.typname = %s "
            "ORDER BY enumsortorder", (udt,))]

    def exists(self, table: str) -> bool:
        return bool(self.execute("SELECT to_regclass(%s)", (f'"{self.name}"."{table}"',))[0][0])

    def partitions(self, table: str) -> list[tuple[str, str]]:
        return []

    def q(self, ident: str) -> str:
        return f'"{ident}"'

    def close(self, wm: str) -> None:
        self.conn.close()
        _drop_pg_database(self.database)


def _pg(database: str = "postgres"):
    conn = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=database)
    conn.autocommit = True
    return conn


def _drop_pg_database(name: str) -> None:
    with contextlib.closing(_pg()) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE database = %s AND active_pid IS NOT NULL", (name,))
        slots = []
        for _ in range(50):
            cur.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,))
            slots = cur.fetchall()
            if not any(pid for _, pid in slots):
                break
            time.sleep(0.1)
        for slot, _ in slots:
            with contextlib.suppress(psycopg2.Error):
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


SOURCES = {"mariadb": MariaSrc, "postgres": PgSrc}


# -- the CDC set-up of one sequence (as tests/integration/conftest.py's CDC) -------------------

class Rig:
    def __init__(self, sdb, tables: list[str], workdir: Path):
        self.sdb, self.tables = sdb, tables
        self.wm = _unique("fzwm")
        self.prefix = _unique("fuzz")
        self.target_db = _unique("fztgt")
        self.dir = workdir
        raw = {
            "sources": {"src": sdb.source_config(tables, self.wm)},
            "targets": {"tgt": {"kind": "postgres", "source": "src", "host": "127.0.0.1",
                                "port": POSTGRES_PORT, "user": "postgres", "database": self.target_db}},
            "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": self.prefix},
            "storage": {"root": str(workdir / "storage")},
            "spark": {"master": "local[2]"},
            "dump": {"chunk_size": 50, "parallelism": 2, "window_timeout_s": 30, "retry_for_s": 20},
            "tail": {"flush_events": 5_000, "flush_seconds": 0.2},
            "apply": {},
        }
        self.path = workdir / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.cfg = load_config(self.path)
        self.src_cfg = self.cfg.source()
        self.state = RedisState(self.cfg.redis_url, self.cfg.state_prefix, "src")
        self.store = EventStore(self.cfg.storage_root, "src")
        self.source = open_source(self.src_cfg)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.tail_error: BaseException | None = None
        self.dumps: list[threading.Thread] = []
        self.dump_notes: list[str] = []

    def qualified(self, table: str) -> str:
        return f"{self.sdb.name}.{table}"

    @property
    def tail_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start_tail(self) -> None:
        if self.tail_running:
            return
        self._stop.clear()
        started = self.state.checkpoint()

        def run():
            try:
                Tail(open_source(self.src_cfg), self.state, self.store, self.cfg.tail,
                     dump=self.cfg.dump).run(should_stop=self._stop.is_set)
            except BaseException as e:  # noqa: BLE001 - surfaced by check_tail
                self.tail_error = e
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if started is None:
            _wait(lambda: self.state.checkpoint() is not None or self.tail_error, 30, "the tail's first checkpoint")
        self.check_tail()

    def check_tail(self) -> None:
        if self.tail_error:
            raise self.tail_error

    def stop_tail(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(60)
        self.check_tail()

    def drain(self, timeout: float = 90) -> None:
        head, _ = self.source.current_resume()

        def reached():
            self.check_tail()
            cp = self.state.checkpoint()
            return cp is not None and cp.pos >= head
        _wait(reached, timeout, f"the tail reaching {head}")

    def dump(self, table: str) -> str:
        """A full dump of ``table``, run here (the tail must run to close its windows)."""
        source = open_source(self.src_cfg)
        try:
            runner = DumpRunner(source, self.state, self.store, LocalChunkReader(source), self.cfg.dump)
            rid = runner.submit(DumpSpec("table", [self.qualified(table)]))
            runner.run(rid)
            return self.state.request(rid)["status"]
        finally:
            source.close()

    def dump_behind(self, table: str) -> None:
        """A dump running across the statements that follow (joined at the sequence's end)."""
        def run():
            try:
                self.dump_notes.append(f"dump {table}: {self.dump(table)}")
            except Exception as e:  # noqa: BLE001 - a dump across a break may fail: the table's check says
                self.dump_notes.append(f"dump {table} failed: {type(e).__name__}: {str(e)[:200]}")
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.dumps.append(t)

    def join_dumps(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for t in self.dumps:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise TimeoutError(f"a dump did not end within {timeout:.0f}s")
        self.dumps = []

    def apply(self) -> dict:
        return run_apply(self.cfg, "tgt", via="local")["tables"]

    def compare(self, table: str):
        q = self.qualified(table)
        self.source.refresh_schema(q)
        schema = self.source.table_schema(q)
        return compare_source_target(self.src_cfg, self.cfg.target("tgt"), schema, target_table_name(schema))

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(60)
        for t in self.dumps:
            t.join(30)
        with contextlib.suppress(Exception):
            self.source.close()
        with contextlib.suppress(Exception):
            _drop_pg_database(self.target_db)
        with contextlib.suppress(Exception):
            keys = list(self.state.r.scan_iter(match=f"{self.prefix}:*"))
            if keys:
                self.state.r.delete(*keys)


# -- values ----------------------------------------------------------------------------------

ODD_STRINGS = ["", " ", "a'b", 'q"q', "back\\slash", "50%", "ünïcödé", "日本語", "\U0001F600", "tab\there",
               "new\nline", "Ã\x81", "\x8d\x8f\x90\x9d", "x ", "NULL", "é" * 3]
LATIN1_STRINGS = ["", "a'b", "ünï", "Ã\x81", "\x81\x8d\x8f\x90\x9d", "ÿþ", "x "]


def _decimal(rng: random.Random, prec: int, scale: int, edge: bool) -> Decimal:
    whole = prec - scale
    if edge:
        top = Decimal(10) ** whole - Decimal(1).scaleb(-scale)
        return rng.choice([top, -top, Decimal(0).scaleb(-scale), Decimal(1).scaleb(-scale)])
    digits = rng.randint(-(10 ** min(prec, 12) - 1), 10 ** min(prec, 12) - 1)
    return Decimal(digits).scaleb(-scale)


INT_RANGE = {"tinyint": 7, "smallint": 15, "mediumint": 23, "int": 31, "integer": 31, "bigint": 63}


def value_for(rng: random.Random, col: dict, sdb) -> object:
    if col["nullable"] and rng.random() < 0.12:
        return None
    t, edge = col["type"], rng.random() < 0.3
    if t in INT_RANGE:
        bits = INT_RANGE[t]
        unsigned = "unsigned" in (col["full"] or "")
        lo, hi = (0, 2 ** (bits + 1) - 1) if unsigned else (-(2 ** bits), 2 ** bits - 1)
        return rng.choice([lo, hi, 0, -1 if lo < 0 else 1]) if edge else rng.randint(max(lo, -1000), min(hi, 100000))
    if t in ("decimal", "numeric"):
        prec, scale = int(col["prec"] or 10), int(col["scale"] or 0)
        return _decimal(rng, prec, scale, edge)
    if t in ("varchar", "char", "character varying", "character", "text", "tinytext", "mediumtext"):
        pool = LATIN1_STRINGS if (col["charset"] or "").startswith("latin1") else ODD_STRINGS
        s = rng.choice(pool) if edge or rng.random() < 0.4 else f"v{rng.randint(0, 99999)}"
        n = col["length"]
        if n and n < 65536:
            s = s[:n] if not edge else (s * n)[:n] if s else s
        return s
    if t == "enum":
        labels = sdb.enum_labels(col["udt"]) if hasattr(sdb, "enum_labels") and col.get("udt") else \
            [v.strip("'") for v in col["full"][len("enum("):-1].split(",")]
        return rng.choice(labels)
    if t == "set":
        labels = [v.strip("'") for v in col["full"][len("set("):-1].split(",")]
        return ",".join(sorted(set(rng.sample(labels, rng.randint(0, len(labels))))))
    if t in ("double", "double precision", "float", "real"):
        return rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-300, 0.1]) if edge else rng.random() * 1000
    if t in ("date",):
        return rng.choice(["2024-02-29", "1970-01-01", "9999-12-31", "1000-01-01"])
    if t.startswith("timestamp") or t == "datetime":
        return rng.choice(["2024-02-29 23:59:59.999999", "1970-01-01 00:00:01", "2038-01-19 03:14:07.5"])
    if t == "boolean":
        return rng.choice([True, False])
    return None


# -- the grammar ----------------------------------------------------------------------------------

@dataclass
class Ctx:
    rng: random.Random
    sdb: object
    table: str
    cols: list[dict]
    counter: list[int] = field(default_factory=lambda: [0])

    def new_name(self, prefix: str = "c") -> str:
        self.counter[0] += 1
        return f"{prefix}{self.counter[0]}_{self.rng.randint(0, 999)}"

    def plain(self, *types: str) -> list[dict]:
        """Non-key, non-generated columns (of the given information_schema types)."""
        return [c for c in self.cols if not c["key"] and not c["generated"] and (not types or c["type"] in types)]

    def pick(self, *types: str) -> dict | None:
        pool = self.plain(*types)
        return self.rng.choice(pool) if pool else None

    def lit(self, col: dict) -> str:
        v = value_for(self.rng, dict(col, nullable=False), self.sdb)
        if isinstance(v, str):
            return "'" + v.replace("\\", "\\\\" if self.sdb.kind == "mysql" else "\\").replace("'", "''") + "'"
        return str(v)


NEW_TYPES = {"mysql": ["INT", "BIGINT", "VARCHAR(12)", "DECIMAL(8,3)", "TEXT", "SMALLINT UNSIGNED",
                       "VARCHAR(20) CHARACTER SET latin1", "ENUM('x','y','z')", "DATETIME(6)", "CHAR(4)"],
             "postgres": ["int", "bigint", "varchar(12)", "numeric(8,3)", "text", "smallint", "char(4)",
                          "timestamp(3)", "boolean"]}


def _ty(ctx: Ctx) -> str:
    return ctx.rng.choice(NEW_TYPES[ctx.sdb.kind])


def _def_of(c: dict) -> str:
    """A MariaDB column definition as it is (for MODIFY/CHANGE keeping the type)."""
    cs = f" CHARACTER SET {c['charset']}" if c["charset"] and c["charset"] != "utf8mb4" else ""
    return f"{c['full']}{cs}{'' if c['nullable'] else ' NOT NULL'}{' INVISIBLE' if c['invisible'] else ''}"


# each kind: ctx -> list of statements (None: not applicable to this table now)

def m_add(ctx):
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} {_ty(ctx)}"]


def m_add_default(ctx):
    n = ctx.new_name()
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {n} VARCHAR(10) NOT NULL DEFAULT '{ctx.rng.choice(['legacy', 'd', ''])}'"]


def m_add_int_default(ctx):
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} BIGINT DEFAULT {ctx.rng.choice([0, -1, 9223372036854775807])}"]


def m_add_first_after(ctx):
    c = ctx.pick()
    where = f"AFTER {c['name']}" if c and ctx.rng.random() < 0.6 else "FIRST"
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} INT {where}"]


def m_drop(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} DROP COLUMN {c['name']}"]


def m_rename(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} RENAME COLUMN {c['name']} TO {ctx.new_name('r')}"]


def m_change(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} CHANGE COLUMN {c['name']} {ctx.new_name('ch')} {_def_of(c)}"]


def m_change_type(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} CHANGE COLUMN {c['name']} {c['name']} {_ty(ctx)}"]


def m_widen_int(ctx):
    c = ctx.pick("tinyint", "smallint", "mediumint", "int")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} BIGINT"]


def m_narrow_int(ctx):
    c = ctx.pick("bigint", "int", "mediumint")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {ctx.rng.choice(['INT', 'SMALLINT'])}"]


def m_widen_decimal(ctx):
    c = ctx.pick("decimal")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} DECIMAL({min(65, c['prec'] + 3)},{min(30, c['scale'] + 1)})"]


def m_narrow_decimal(ctx):
    c = ctx.pick("decimal")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} DECIMAL({max(2, c['prec'] - 2)},{max(0, c['scale'] - 1)})"]


def m_widen_varchar(ctx):
    c = ctx.pick("varchar", "char")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {c['type'].upper()}({c['length'] + 10})"
                  + (f" CHARACTER SET {c['charset']}" if c["charset"] else "")]


def m_narrow_varchar(ctx):
    c = ctx.pick("varchar")
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} VARCHAR({max(1, c['length'] // 2)})"
                  + (f" CHARACTER SET {c['charset']}" if c["charset"] else "")]


def m_set_default(ctx):
    c = ctx.pick("varchar", "int", "bigint", "decimal")
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} SET DEFAULT {ctx.lit(c)}"]


def m_drop_default(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} DROP DEFAULT"]


def m_not_null(ctx):
    c = ctx.pick("int", "bigint", "varchar", "decimal")
    return c and [f"UPDATE {ctx.table} SET {c['name']} = {ctx.lit(c)} WHERE {c['name']} IS NULL",
                  f"ALTER TABLE {ctx.table} MODIFY {c['name']} {c['full']} NOT NULL"]


def m_reorder(ctx):
    c, d = ctx.pick(), ctx.pick()
    if not c:
        return None
    where = f"AFTER {d['name']}" if d and d is not c and ctx.rng.random() < 0.6 else "FIRST"
    return [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {_def_of(c)} {where}"]


def m_invisible(ctx):
    if ctx.rng.random() < 0.5:
        return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name('inv')} INT DEFAULT 7 INVISIBLE"]
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {c['full']} INVISIBLE"]


def m_generated(ctx):
    c = ctx.pick("int", "bigint")
    expr = f"({c['name']} DIV 2)" if c else "(id + 1)"
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name('g')} BIGINT AS {expr} "
            f"{ctx.rng.choice(['VIRTUAL', 'PERSISTENT'])}"]


def m_enum_add(ctx):
    c = ctx.pick("enum", "set")
    if not c:
        return None
    labels = c["full"][len(c["type"]) + 1:-1]
    new = f"'n{ctx.rng.randint(0, 99)}'"
    body = f"{new},{labels}" if ctx.rng.random() < 0.3 else f"{labels},{new}"   # in front: renumbers
    return [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {c['type'].upper()}({body})"]


def m_charset(ctx):
    c = ctx.pick("varchar", "char", "text")
    if ctx.rng.random() < 0.3 or not c:
        return [f"ALTER TABLE {ctx.table} CONVERT TO CHARACTER SET {ctx.rng.choice(['utf8mb4', 'latin1'])}"]
    cs = "utf8mb4" if (c["charset"] or "").startswith("latin1") else "latin1"
    return [f"ALTER TABLE {ctx.table} MODIFY {c['name']} {c['full']} CHARACTER SET {cs}"]


def m_add_index(ctx):
    c = ctx.pick("int", "bigint", "varchar", "decimal")
    return c and [f"ALTER TABLE {ctx.table} ADD INDEX {ctx.new_name('ix')} ({c['name']})"]


def m_drop_index(ctx):
    rows = ctx.sdb.execute("SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = %s "
                           "AND table_name = %s AND index_name <> 'PRIMARY'", (ctx.sdb.name, ctx.table))
    return rows and [f"ALTER TABLE {ctx.table} DROP INDEX `{ctx.rng.choice(rows)[0]}`"]


def _parts(ctx):
    return ctx.sdb.partitions(ctx.table)


def m_part_add(ctx):
    parts = _parts(ctx)
    if not parts or parts[-1][1] == "MAXVALUE":
        return None
    hi = int(parts[-1][1])
    return [f"ALTER TABLE {ctx.table} ADD PARTITION (PARTITION {ctx.new_name('p')} VALUES LESS THAN ({hi + 500}))"]


def m_part_drop(ctx):
    parts = _parts(ctx)
    return len(parts) > 1 and [f"ALTER TABLE {ctx.table} DROP PARTITION {ctx.rng.choice(parts)[0]}"]


def m_part_truncate(ctx):
    parts = _parts(ctx)
    return parts and [f"ALTER TABLE {ctx.table} TRUNCATE PARTITION {ctx.rng.choice(parts)[0]}"]


def m_part_reorganize(ctx):
    parts = _parts(ctx)
    if not parts:
        return None
    i = ctx.rng.randrange(len(parts))
    lo = int(parts[i - 1][1]) if i else 0
    hi = parts[i][1]
    top = 10 ** 9 if hi == "MAXVALUE" else int(hi)
    if top - lo < 2:
        return None
    mid = lo + (min(top, lo + 1000) - lo) // 2
    return [f"ALTER TABLE {ctx.table} REORGANIZE PARTITION {parts[i][0]} INTO ("
            f"PARTITION {ctx.new_name('p')} VALUES LESS THAN ({mid}), "
            f"PARTITION {ctx.new_name('p')} VALUES LESS THAN ({hi}))"]


def m_part_remove(ctx):
    return _parts(ctx) and [f"ALTER TABLE {ctx.table} REMOVE PARTITIONING"]


def m_part_by(ctx):
    if _parts(ctx) or ctx.table != "p":
        return None
    return [f"ALTER TABLE {ctx.table} PARTITION BY RANGE (id) (PARTITION {ctx.new_name('p')} VALUES LESS THAN (500), "
            f"PARTITION {ctx.new_name('p')} VALUES LESS THAN MAXVALUE)"]


def m_part_exchange(ctx):
    parts = _parts(ctx)
    if not parts:
        return None
    x = ctx.new_name("xch")
    return [f"CREATE TABLE {x} LIKE {ctx.table}", f"ALTER TABLE {x} REMOVE PARTITIONING",
            f"ALTER TABLE {ctx.table} EXCHANGE PARTITION {ctx.rng.choice(parts)[0]} WITH TABLE {x}",
            f"DROP TABLE {x}"]


def m_truncate(ctx):
    return [f"TRUNCATE TABLE {ctx.table}"]


def m_rename_table_back(ctx):
    x = ctx.new_name("away")
    return [f"RENAME TABLE {ctx.table} TO {x}", f"INSERT INTO {x} (id) VALUES ({ctx.rng.randint(1000, 1999)})",
            f"RENAME TABLE {x} TO {ctx.table}"]


def m_alter_rename_table_back(ctx):
    x = ctx.new_name("away")
    return [f"ALTER TABLE {ctx.table} RENAME TO {x}", f"ALTER TABLE {x} RENAME TO {ctx.table}"]


def m_drop_create(ctx):
    return [f"DROP TABLE {ctx.table}", CREATE[ctx.sdb.kind][ctx.table]]


def m_create_or_replace(ctx):
    return [CREATE[ctx.sdb.kind][ctx.table].replace("CREATE TABLE", "CREATE OR REPLACE TABLE", 1)]


def m_drop_add_same(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} DROP COLUMN {c['name']}, ADD COLUMN {c['name']} {_def_of(c)}"]


def m_rename_swap(ctx):
    pool = ctx.plain()
    if len(pool) < 2:
        return None
    a, b = ctx.rng.sample(pool, 2)
    tmp = ctx.new_name("tmp")
    return [f"ALTER TABLE {ctx.table} RENAME COLUMN {a['name']} TO {tmp}, RENAME COLUMN {b['name']} TO {a['name']}, "
            f"RENAME COLUMN {tmp} TO {b['name']}"]


def m_rename_chain(ctx):
    pool = ctx.plain()
    if len(pool) < 2:
        return None
    a, b = ctx.rng.sample(pool, 2)
    return [f"ALTER TABLE {ctx.table} DROP COLUMN {b['name']}", f"ALTER TABLE {ctx.table} RENAME COLUMN {a['name']} TO {b['name']}"]


def m_set_then_default(ctx):
    """ADD with a literal default, then the default changed (the tail reads it later)."""
    n = ctx.new_name("src")
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {n} VARCHAR(10) DEFAULT 'legacy'",
            f"ALTER TABLE {ctx.table} ALTER COLUMN {n} SET DEFAULT 'web'"]


MARIADB_KINDS = {
    "add_column": m_add, "add_column_literal_default": m_add_default, "add_bigint_default": m_add_int_default,
    "add_column_first_after": m_add_first_after, "drop_column": m_drop, "rename_column": m_rename,
    "change_column_rename": m_change, "change_column_type": m_change_type, "widen_int": m_widen_int,
    "narrow_int": m_narrow_int, "widen_decimal": m_widen_decimal, "narrow_decimal": m_narrow_decimal,
    "widen_varchar": m_widen_varchar, "narrow_varchar": m_narrow_varchar, "set_default": m_set_default,
    "drop_default": m_drop_default, "not_null": m_not_null, "reorder": m_reorder, "invisible": m_invisible,
    "generated_column": m_generated, "enum_set_value_added": m_enum_add, "charset_change": m_charset,
    "add_index": m_add_index, "drop_index": m_drop_index, "partition_add": m_part_add,
    "partition_drop": m_part_drop, "partition_truncate": m_part_truncate,
    "partition_reorganize": m_part_reorganize, "partition_remove": m_part_remove, "partition_by": m_part_by,
    "partition_exchange": m_part_exchange, "truncate_table": m_truncate, "rename_table_away_back": m_rename_table_back,
    "alter_rename_table_away_back": m_alter_rename_table_back, "drop_create_table": m_drop_create,
    "create_or_replace": m_create_or_replace, "drop_add_same_column": m_drop_add_same,
    "rename_swap": m_rename_swap, "rename_chain": m_rename_chain, "add_then_set_default": m_set_then_default,
}


# -- PostgreSQL ------------------------------------------------------------------------------

def p_add(ctx):
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} {_ty(ctx)}"]


def p_add_default(ctx):
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} varchar(10) NOT NULL "
            f"DEFAULT '{ctx.rng.choice(['legacy', 'd', ''])}'"]


def p_add_volatile_default(ctx):
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name()} int DEFAULT floor(random() * 1000)::int"]


def p_drop(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} DROP COLUMN {c['name']}"]


def p_rename(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} RENAME COLUMN {c['name']} TO {ctx.new_name('r')}"]


def _alter_type(ctx, types: tuple, new: str, using: str = "") -> list[str] | None:
    c = ctx.pick(*types)
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} TYPE {new(c) if callable(new) else new}"
                  + (f" USING {using.format(c=c['name'])}" if using else "")]


def p_widen_int(ctx):
    return _alter_type(ctx, ("smallint", "integer"), "bigint")


def p_narrow_int(ctx):
    return _alter_type(ctx, ("bigint", "integer"), ctx.rng.choice(["integer", "smallint"]))


def p_widen_numeric(ctx):
    return _alter_type(ctx, ("numeric",), lambda c: f"numeric({(c['prec'] or 10) + 3},{(c['scale'] or 0) + 1})")


def p_narrow_numeric(ctx):
    return _alter_type(ctx, ("numeric",), lambda c: f"numeric({max(2, (c['prec'] or 10) - 2)},{max(0, (c['scale'] or 0) - 1)})")


def p_numeric_unconstrained(ctx):
    return _alter_type(ctx, ("numeric", "integer", "bigint"), "numeric")


def p_widen_varchar(ctx):
    return _alter_type(ctx, ("character varying",), lambda c: f"varchar({(c['length'] or 10) + 10})")


def p_narrow_varchar(ctx):
    return _alter_type(ctx, ("character varying",), lambda c: f"varchar({max(1, (c['length'] or 10) // 2)})")


def p_char_len(ctx):
    return _alter_type(ctx, ("character",), lambda c: f"char({(c['length'] or 4) + ctx.rng.choice([-1, 2])})")


def p_varchar_to_text(ctx):
    return _alter_type(ctx, ("character varying", "character"), "text")


def p_text_to_varchar(ctx):
    return _alter_type(ctx, ("text",), "varchar(30)")


def p_using_text(ctx):
    return _alter_type(ctx, ("integer", "bigint", "numeric"), "text", "{c}::text")


def p_using_int(ctx):
    return _alter_type(ctx, ("text", "character varying"), "bigint", "length({c})")


def p_timestamp_precision(ctx):
    return _alter_type(ctx, ("timestamp without time zone",), f"timestamp({ctx.rng.choice([0, 3, 6])})")


def p_set_default(ctx):
    c = ctx.pick("character varying", "integer", "bigint", "numeric")
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} SET DEFAULT {ctx.lit(c)}"]


def p_drop_default(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} DROP DEFAULT"]


def p_set_not_null(ctx):
    c = ctx.pick("integer", "bigint", "character varying", "numeric")
    return c and [f"UPDATE {ctx.table} SET {c['name']} = {ctx.lit(c)} WHERE {c['name']} IS NULL",
                  f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} SET NOT NULL"]


def p_drop_not_null(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} ALTER COLUMN {c['name']} DROP NOT NULL"]


def p_drop_add_same(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} DROP COLUMN {c['name']}", f"ALTER TABLE {ctx.table} ADD COLUMN {c['name']} {c['full']}"]


def p_drop_add_one(ctx):
    c = ctx.pick()
    return c and [f"ALTER TABLE {ctx.table} DROP COLUMN {c['name']}, ADD COLUMN {c['name']} {c['full']}"]


def p_rename_swap(ctx):
    pool = ctx.plain()
    if len(pool) < 2:
        return None
    a, b = ctx.rng.sample(pool, 2)
    tmp = ctx.new_name("tmp")
    return [f"ALTER TABLE {ctx.table} RENAME COLUMN {a['name']} TO {tmp}",
            f"ALTER TABLE {ctx.table} RENAME COLUMN {b['name']} TO {a['name']}",
            f"ALTER TABLE {ctx.table} RENAME COLUMN {tmp} TO {b['name']}"]


def p_rename_chain(ctx):
    pool = ctx.plain()
    if len(pool) < 2:
        return None
    a, b = ctx.rng.sample(pool, 2)
    return [f"ALTER TABLE {ctx.table} DROP COLUMN {b['name']}", f"ALTER TABLE {ctx.table} RENAME COLUMN {a['name']} TO {b['name']}"]


def p_rename_table_back(ctx):
    x = ctx.new_name("away")
    return [f"ALTER TABLE {ctx.table} RENAME TO {x}", f"INSERT INTO {x} (id) VALUES ({ctx.rng.randint(1000, 1999)})",
            f"ALTER TABLE {x} RENAME TO {ctx.table}"]


def p_rename_away_recreate(ctx):
    x = ctx.new_name("old")
    return [f"ALTER TABLE {ctx.table} RENAME TO {x}", f"CREATE TABLE {ctx.table} (LIKE {x} INCLUDING ALL)",
            f"ALTER TABLE {ctx.table} REPLICA IDENTITY FULL",
            f"INSERT INTO {ctx.table} (id) VALUES ({ctx.rng.randint(2000, 2999)})"]


def p_drop_create(ctx):
    return [f"DROP TABLE {ctx.table}", CREATE["postgres"][ctx.table], f"ALTER TABLE {ctx.table} REPLICA IDENTITY FULL"]


def p_truncate(ctx):
    return [f"TRUNCATE {ctx.table}"]


def p_replica_identity(ctx):
    return [f"ALTER TABLE {ctx.table} REPLICA IDENTITY {ctx.rng.choice(['DEFAULT', 'FULL'])}"]


def p_add_index(ctx):
    c = ctx.pick()
    return c and [f"CREATE INDEX {ctx.new_name('ix')} ON {ctx.table} ({c['name']})"]


def p_drop_index(ctx):
    rows = ctx.sdb.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s "
                           "AND indexname NOT LIKE '%%pkey'", (ctx.sdb.name, ctx.table))
    return rows and [f'DROP INDEX "{ctx.rng.choice(rows)[0]}"']


def p_generated(ctx):
    c = ctx.pick("integer", "bigint")
    expr = f"{c['name']} / 2" if c else "id + 1"
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {ctx.new_name('g')} bigint GENERATED ALWAYS AS ({expr}) STORED"]


def p_enum_add(ctx):
    c = ctx.pick("enum")
    if not c:
        return None
    new = f"n{ctx.rng.randint(0, 999)}"
    first = ctx.sdb.enum_labels(c["udt"])[0]
    where = f" BEFORE '{first}'" if ctx.rng.random() < 0.3 else ""
    return [f"ALTER TYPE {c['udt']} ADD VALUE IF NOT EXISTS '{new}'{where}"]


def p_enum_rename_value(ctx):
    c = ctx.pick("enum")
    if not c:
        return None
    old = ctx.rng.choice(ctx.sdb.enum_labels(c["udt"]))
    return [f"ALTER TYPE {c['udt']} RENAME VALUE '{old}' TO 'rn{ctx.rng.randint(0, 999)}'"]


def p_pk_deferrable(ctx):
    return [f"ALTER TABLE {ctx.table} DROP CONSTRAINT {ctx.table}_pkey, "
            f"ADD CONSTRAINT {ctx.table}_pkey PRIMARY KEY (id) DEFERRABLE INITIALLY {ctx.rng.choice(['DEFERRED', 'IMMEDIATE'])}"]


def p_collation(ctx):
    return _alter_type(ctx, ("text", "character varying"), lambda c: f'{c["full"]} COLLATE "C"')


def p_set_then_default(ctx):
    n = ctx.new_name("src")
    return [f"ALTER TABLE {ctx.table} ADD COLUMN {n} varchar(10) DEFAULT 'legacy'",
            f"ALTER TABLE {ctx.table} ALTER COLUMN {n} SET DEFAULT 'web'"]


POSTGRES_KINDS = {
    "add_column": p_add, "add_column_literal_default": p_add_default, "add_volatile_default": p_add_volatile_default,
    "drop_column": p_drop, "rename_column": p_rename, "widen_int": p_widen_int, "narrow_int": p_narrow_int,
    "widen_numeric": p_widen_numeric, "narrow_numeric": p_narrow_numeric, "numeric_unconstrained": p_numeric_unconstrained,
    "widen_varchar": p_widen_varchar, "narrow_varchar": p_narrow_varchar, "char_length": p_char_len,
    "varchar_to_text": p_varchar_to_text, "text_to_varchar": p_text_to_varchar, "type_using_text": p_using_text,
    "type_using_int": p_using_int, "timestamp_precision": p_timestamp_precision, "set_default": p_set_default,
    "drop_default": p_drop_default, "set_not_null": p_set_not_null, "drop_not_null": p_drop_not_null,
    "drop_add_same_column": p_drop_add_same, "drop_add_one_statement": p_drop_add_one, "rename_swap": p_rename_swap,
    "rename_chain": p_rename_chain, "rename_table_away_back": p_rename_table_back,
    "rename_away_recreate": p_rename_away_recreate, "drop_create_table": p_drop_create, "truncate_table": p_truncate,
    "replica_identity": p_replica_identity, "add_index": p_add_index, "drop_index": p_drop_index,
    "generated_column": p_generated, "enum_value_added": p_enum_add, "enum_value_renamed": p_enum_rename_value,
    "pk_deferrable": p_pk_deferrable, "collation_change": p_collation, "add_then_set_default": p_set_then_default,
}

KINDS = {"mariadb": MARIADB_KINDS, "postgres": POSTGRES_KINDS}

CREATE = {
    "mysql": {
        "a": ("CREATE TABLE a (id INT NOT NULL PRIMARY KEY, i INT, n BIGINT, d DECIMAL(10,2), s VARCHAR(20), "
              "l VARCHAR(16) CHARACTER SET latin1, e ENUM('a','b','c'), st SET('x','y'), t TEXT, "
              "u INT UNSIGNED, ts DATETIME(6)) DEFAULT CHARSET utf8mb4"),
        "p": ("CREATE TABLE p (id INT NOT NULL, v INT, s VARCHAR(10), d DECIMAL(6,3), PRIMARY KEY (id)) "
              "DEFAULT CHARSET utf8mb4 PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (100), "
              "PARTITION p1 VALUES LESS THAN (300), PARTITION p2 VALUES LESS THAN (1000))"),
        "b": "CREATE TABLE b (id INT NOT NULL PRIMARY KEY, v INT, s VARCHAR(20)) DEFAULT CHARSET utf8mb4",
    },
    "postgres": {
        "a": ("CREATE TABLE a (id int PRIMARY KEY, i int, n bigint, d numeric(10,2), s varchar(20), c char(5), "
              "e mood, t text, ts timestamp(6), sm smallint)"),
        "p": "CREATE TABLE p (id int PRIMARY KEY, v int, s varchar(10), d numeric(6,3))",
        "b": "CREATE TABLE b (id int PRIMARY KEY, v int, s varchar(20))",
    },
}
TABLES = ["a", "p", "b"]


def kinds(source: str, exclude_known: bool = False) -> dict:
    ks = KINDS[source]
    return {k: f for k, f in ks.items() if not (exclude_known and k in KNOWN_DIVERGENT.get(source, {}))}


# -- row writes ------------------------------------------------------------------------------

def write(rng: random.Random, sdb, table: str, log: list[str]) -> None:
    cols = [c for c in sdb.columns(table) if not c["generated"]]
    op = rng.choices(["insert", "update", "delete", "txn"], [5, 3, 1, 1])[0]
    if op == "txn":
        stmts = []
        for _ in range(3):
            stmts += _write_sql(rng, sdb, table, cols, rng.choice(["insert", "update", "delete"]))
        stmts = [("BEGIN", None)] + [s for s in stmts if s] + [("COMMIT", None)]
    else:
        stmts = _write_sql(rng, sdb, table, cols, op)
    for sql, args in stmts:
        log.append(_render(sql, args))
        try:
            sdb.execute(sql, args)
        except Refused:
            log.append("  -- refused")
            with contextlib.suppress(Exception):
                sdb.execute("ROLLBACK")
            return


def _render(sql, args) -> str:
    return sql if args is None else f"{sql} -- {args!r}"


def _key_of(rng, sdb, table) -> int | None:
    rows = sdb.execute(f"SELECT id FROM {table} ORDER BY id")   # the seed's choice, not the server's
    return rng.choice(rows)[0] if rows else None


def _write_sql(rng, sdb, table, cols, op) -> list[tuple[str, object]]:
    q = sdb.q
    if op == "insert":
        key = rng.randint(1, 999) if rng.random() < 0.95 else rng.choice([2147483647, 999])
        names = [c for c in cols if not c["key"] and rng.random() < 0.85]
        args = [key] + [value_for(rng, c, sdb) for c in names]
        return [(f"INSERT INTO {table} (id{''.join(', ' + q(c['name']) for c in names)}) "
                 f"VALUES ({', '.join(['%s'] * len(args))})", args)]
    key = _key_of(rng, sdb, table)
    if key is None:
        return []
    if op == "delete":
        return [(f"DELETE FROM {table} WHERE id = %s", [key])]
    names = [c for c in cols if not c["key"]]
    if not names:
        return []
    names = rng.sample(names, rng.randint(1, min(3, len(names))))
    return [(f"UPDATE {table} SET {', '.join(q(c['name']) + ' = %s' for c in names)} WHERE id = %s",
             [value_for(rng, c, sdb) for c in names] + [key])]


# -- one sequence ------------------------------------------------------------------------------

@dataclass
class Outcome:
    seq: int
    seed: str
    statements: int = 0
    ddl: list[str] = field(default_factory=list)
    refused: int = 0
    writes: int = 0
    tables: dict[str, str] = field(default_factory=dict)   # table -> class
    notes: dict[str, str] = field(default_factory=dict)    # table -> message / diff
    log: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def run_sequence(source: str, seed: int, seq: int, statements: int, *, exclude_known: bool = False,
                 release_each_step: bool = False,
                 workdir: Path | None = None, out=print) -> Outcome:
    seed_s = f"{seed}-{source}-{seq}"
    rng = random.Random(seed_s)
    o = Outcome(seq, seed_s)
    started = time.monotonic()
    grammar = kinds(source, exclude_known)
    sdb = SOURCES[source]()
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-", dir=workdir))
    rig = None
    log = o.log
    try:
        if sdb.kind == "postgres":
            sdb.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        for t in TABLES:
            sdb.execute(CREATE[sdb.kind][t])
            log.append(CREATE[sdb.kind][t])
            if sdb.kind == "postgres":
                sdb.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
            for _ in range(rng.randint(3, 8)):   # rows before capture: the first dump brings them
                write(rng, sdb, t, log)
        rig = Rig(sdb, TABLES, tmp)
        rig.start_tail()
        for t in TABLES:
            status = rig.dump(t)
            if status != "done":
                raise RuntimeError(f"the first dump of {t}: {status}")
        rig.apply()
        log.append("-- tail started, first dumps done and applied")
        counter = [0]
        for _ in range(statements):
            r = rng.random()
            if r < 0.10:
                if rig.tail_running:
                    rig.stop_tail()
                    log.append("-- tail stopped")
                else:
                    rig.start_tail()
                    log.append("-- tail started")
                continue
            table = rng.choice(TABLES)
            if r < 0.14:
                log.append("-- apply")
                rig.apply()    # raises: every table stopped (ERROR)
                continue
            if r < 0.19:
                if rig.tail_running:
                    rig.dump_behind(table)
                    log.append(f"-- dump of {table} started")
                continue
            if r < 0.45:
                for _ in range(rng.randint(1, 4)):
                    write(rng, sdb, table, log)
                    o.writes += 1
                continue
            ctx = Ctx(rng, sdb, table, sdb.columns(table), counter)
            kind = rng.choice(sorted(grammar))
            stmts = grammar[kind](ctx)
            if not stmts:
                continue
            o.statements += 1
            o.ddl.append(kind)
            log.append(f"-- [{kind}] on {table}")
            for s in stmts:
                log.append(s)
                try:
                    sdb.execute(s)
                except Refused as e:
                    log.append(f"  -- refused: {str(e)[:160]}")
                    if s.startswith(("INSERT", "UPDATE")):   # a row in between: the statements go on
                        continue
                    o.refused += 1
                    break
            for _ in range(rng.randint(0, 2)):
                write(rng, sdb, table, log)
            if release_each_step:
                _release_now(rig, log)
        _finish(rig, o)
    except Exception as e:  # noqa: BLE001 - the tail or the apply raised: every table stopped
        o.error = f"{type(e).__name__}: {e}"
        log.append(traceback.format_exc())
        for t in TABLES:
            o.tables.setdefault(t, ERROR)
    finally:
        if rig:
            rig.close()
        sdb.close(rig.wm if rig else "")
        shutil.rmtree(tmp, ignore_errors=True)
        o.seconds = round(time.monotonic() - started, 1)
    counts = {k: sum(1 for v in o.tables.values() if v == k) for k in (EQUAL, RELEASED, DIVERGED, ERROR)}
    out(f"[{source} seq {seq} seed {seed_s}] {o.statements} DDL ({o.refused} refused), {o.writes} writes, tables: "
        + ", ".join(f"{t}={c}" for t, c in o.tables.items())
        + f" | {counts} {o.seconds}s" + (f" ERROR {o.error[:300]}" if o.error else ""))
    return o


def _release_now(rig: Rig, log: list[str]) -> None:
    """An operator who repairs at once (``release_each_step``): after each DDL step the tail
    catches up, the apply runs and a quarantined or held table is re-dumped."""
    if not rig.tail_running:
        rig.start_tail()
        log.append("-- tail started")
    rig.drain()
    for q, r in rig.apply().items():
        if _why(r):
            t = q.split(".", 1)[1]
            log.append(f"-- {t} {_why(r)[:200]}: re-dumped ({rig.dump(t)})")
    rig.drain()


def _touch(sdb, table: str, log: list[str]) -> None:
    """PostgreSQL logs no DDL: a table's new shape reaches the log with its next row event
    (a Relation message). One row rewritten as it is (or a row added and removed), so a
    change on a quiet table is in the log as a workload's next write would put it."""
    for sql in ([f"UPDATE {table} SET id = id WHERE id = (SELECT min(id) FROM {table})"]
                if sdb.execute(f"SELECT 1 FROM {table} LIMIT 1") else
                [f"INSERT INTO {table} (id) VALUES (-7)", f"DELETE FROM {table} WHERE id = -7"]):
        log.append(sql)
        try:
            sdb.execute(sql)
        except Refused as e:
            log.append(f"  -- refused: {str(e)[:160]}")
            return


def _finish(rig: Rig, o: Outcome) -> None:
    if rig.sdb.kind == "postgres":
        for t in TABLES:
            _touch(rig.sdb, t, o.log)
    rig.start_tail()
    rig.join_dumps()
    o.log.extend(f"-- {n}" for n in rig.dump_notes)
    if rig.sdb.kind == "postgres":
        # the log has no DDL: a watermark (as every dump window writes) carries the tables'
        # shapes and oids, so a table dropped and created again is seen before the end
        source = open_source(rig.src_cfg)
        try:
            source.write_watermark(uuid.uuid4().hex)
        finally:
            source.close()
    rig.drain()
    res = rig.apply()
    for t in TABLES:
        q = rig.qualified(t)
        r = res.get(q, {})
        why = _why(r)
        equal, diff = _compare(rig, t)
        if why is None:
            o.tables[t] = EQUAL if equal else DIVERGED
            if not equal:
                o.notes[t] = f"apply status {r.get('status')!r}, not quarantined or held: {diff}"
            continue
        # quarantined or held: the fix is a full dump of the table
        status = ""
        for _ in range(3):
            status = rig.dump(t)
            rig.drain()
            r = rig.apply().get(q, {})
            if _why(r) is None:
                break
        equal, diff = _compare(rig, t)
        o.tables[t] = RELEASED if equal and _why(r) is None else DIVERGED
        o.notes[t] = why + ("" if o.tables[t] == RELEASED else
                            f" | after the dump ({status}): status {r.get('status')!r} {_why(r) or ''}; {diff}")


def _compare(rig: Rig, table: str) -> tuple[bool, str]:
    """(equal, what differs); a target that cannot even be read as the source's shape
    (a column missing) is a difference too."""
    try:
        diff = rig.compare(table)
    except Exception as e:  # noqa: BLE001
        return False, f"compare failed: {type(e).__name__}: {str(e).strip()[:400]}"
    if diff.equal:
        return True, diff.describe()
    return False, diff.describe(3) + _sample(rig, table, (diff.different + diff.missing + diff.extra)[:3])


def _sample(rig: Rig, table: str, keys: list) -> str:
    """The rows of a few differing keys on both sides, as each side's driver reads them."""
    import json
    from airflow_provider_dblog.engine.targets import PostgresTarget
    try:
        ids = [json.loads(k)[0] if isinstance(k, str) else k[0] for k in keys]
        src = rig.sdb.execute(f"SELECT * FROM {table} WHERE id IN ({', '.join(['%s'] * len(ids))}) ORDER BY id", ids)
        with PostgresTarget(rig.cfg.target("tgt")) as tgt, tgt.conn.cursor() as cur:
            name = tgt.qualified_stage(target_table_name(rig.source.table_schema(rig.qualified(table))))
            cur.execute(f"SELECT * FROM {name} WHERE id = ANY(%s) ORDER BY id", (ids,))
            cols = [d[0] for d in cur.description]
            tgt_rows = cur.fetchall()
        src_cols = [c["name"] for c in rig.sdb.columns(table)]
        return f"\n      source {src_cols}: {src}\n      target {cols}: {tgt_rows}"
    except Exception as e:  # noqa: BLE001 - a sample is a help, not the finding
        return f" (no sample: {type(e).__name__}: {str(e)[:200]})"


def _why(r: dict) -> str | None:
    if r.get("status") == "quarantined":
        return f"quarantined: {(r.get('quarantined') or {}).get('why', r)}"
    if r.get("status") == "held":
        return f"held: {r.get('held') or r.get('error') or r}"
    return None


# -- the run -----------------------------------------------------------------------------------

def run(source: str, seed: int, sequences: int, statements: int, *, first: int = 0, exclude_known: bool = False,
        out=print) -> dict:
    outcomes = [run_sequence(source, seed, i, statements, exclude_known=exclude_known, out=out)
                for i in range(first, first + sequences)]
    total = {"source": source, "sequences": len(outcomes), "statements": sum(o.statements for o in outcomes),
             "refused": sum(o.refused for o in outcomes), "tables": sum(len(o.tables) for o in outcomes)}
    for k in (EQUAL, RELEASED, DIVERGED, ERROR):
        total[k] = sum(1 for o in outcomes for v in o.tables.values() if v == k)
    out(f"TOTAL {total}")
    bad = [o for o in outcomes if o.error or DIVERGED in o.tables.values()]
    for o in bad:
        out(f"\n=== {source} seed {o.seed} (--seed {seed} --first {o.seq} --sequences 1): "
            f"{o.error or ''}")
        for t, c in o.tables.items():
            if c in (DIVERGED, ERROR):
                out(f"  {t}: {c}: {o.notes.get(t, '')}")
        out("  statements:")
        for line in o.log[-400:]:
            out(f"    {line}")
    total["outcomes"] = outcomes
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.schema_fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=sorted(SOURCES), required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sequences", type=int, default=10)
    p.add_argument("--statements", type=int, default=30)
    p.add_argument("--first", type=int, default=0, help="the first sequence's number (to replay one)")
    p.add_argument("--exclude-known", action="store_true", help="leave out KNOWN_DIVERGENT kinds")
    p.add_argument("--verbose", action="store_true", help="the engine's log too")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.CRITICAL)
    total = run(a.source, a.seed, a.sequences, a.statements, first=a.first, exclude_known=a.exclude_known)
    return 1 if total[DIVERGED] or total[ERROR] else 0


if __name__ == "__main__":
    raise SystemExit(main())
