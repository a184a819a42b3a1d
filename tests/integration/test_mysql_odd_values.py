"""MariaDB values and tables that split a target from its source (issue 27, cases 5, 8, 9),
each on the real servers, each failing on the code before its fix:

* latin1 bytes 0x81, 0x8D, 0x8F, 0x90, 0x9D (MariaDB's latin1 is cp1252 plus those five, as
  the C1 controls of the same number; Python's cp1252 has no character for them): one such
  value killed the tail, for every table, on every restart. Now every byte reaches the
  target exactly by the log, a key-list dump and a range dump, in text and in key columns;
  and a byte a column's codec still cannot decode holds that table only, naming it.
* An INVISIBLE column (``SELECT *`` leaves it out): every Spark dump of the table failed.
* An ENUM key whose labels are not in alphabetical order (ENUM sorts by index): a range
  dump must chunk it in the server's order; a chunk boundary that does not advance fails
  the dump at once instead of looping.
"""
from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.cli import status
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.errors import DBLogError
from airflow_provider_dblog.engine.keys import encode_scalar
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources.base import ChunkPlan

from helpers import wait_until

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)

# every byte but 0x00: a NUL is a value no PostgreSQL text holds (held by design, README)
BYTES = [bytes([b]) for b in range(1, 256)]
LATIN1 = "CHARACTER SET latin1"


def _equal(cdc, *tables: str) -> None:
    for t in tables:
        diff = cdc.compare(t)
        assert diff.equal, diff.describe()
        assert diff.source_rows > 0, t


def _applied(cdc, via: str = "local") -> dict:
    return run_apply(cdc.cfg, "tgt", via=via)["tables"]


def _latin1_rows(cur, base: int, tag: bytes) -> None:
    """One row per byte in ``lt`` (ids ``base`` + byte) and in ``lk`` (key ``tag`` + byte)."""
    for b in BYTES:
        n = base + b[0]
        cur.execute("INSERT INTO lt VALUES (%s, %s, %s, %s)", (n, b, b + b"z", b"a" + b * 3 + b"\x81"))
        cur.execute("INSERT INTO lk VALUES (%s, %s)", (tag + b, n))


@MARIADB
def test_every_latin1_byte_reaches_the_target_by_log_and_by_dump(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "lt", f"id INT PRIMARY KEY, vc VARCHAR(8) {LATIN1}, ch CHAR(3) {LATIN1}, "
                                       f"tx TEXT {LATIN1}")
        src_db.create_table(cur, "lk", f"k VARCHAR(4) {LATIN1} COLLATE latin1_bin PRIMARY KEY, v INT")
        src_db.create_table(cur, "ok", "id INT PRIMARY KEY, v INT")
        _latin1_rows(cur, 1000, b"D")                 # there before the tail: dumps carry them
    cdc = make_cdc(["lt", "lk", "ok"], dump={"chunk_size": 40})
    assert not cdc.source.check(scan_values=True), cdc.source.check(scan_values=True)
    cdc.start_tail()
    with src_db.cursor() as cur:
        _latin1_rows(cur, 0, b"L")                    # the log carries them
        cur.execute("UPDATE lt SET vc = CONCAT(vc, X'8D'), tx = CONCAT(X'9D', tx) WHERE id % 3 = 0")
        cur.execute("UPDATE lk SET k = CONCAT(k, X'90') WHERE v % 5 = 0")   # key changes: before images too
        cur.execute("INSERT INTO ok VALUES (1, 1), (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    res = _applied(cdc)
    assert all(r["status"] in ("applied", "empty") for r in res.values()), res

    # a key-list dump of the rows the log never carried, the keys as the source prints them
    for table, where in (("lk", "v >= 1000"), ("lt", "id >= 1000")):
        schema = cdc.source.table_schema(f"{cdc.db}.{table}")
        keys = [[encode_scalar(v) for v in k] for k in cdc.source.keys_where(schema, where, 10_000)]
        rid = cdc.request(DumpSpec("keys", [schema.qualified], keys=keys, chunk_size=100))
        DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        assert cdc.state.progress(rid, schema.qualified)["missing_count"] == 0
    cdc.drain()
    res = _applied(cdc)
    assert all(r["status"] in ("applied", "empty") for r in res.values()), res
    _equal(cdc, "lt", "lk", "ok")

    # a full dump by key ranges on Spark, into damaged targets, then the Spark apply
    with cdc.target() as t, t.conn, t.conn.cursor() as cur:
        cur.execute(f'UPDATE "{t.schema}"."{cdc.db}__lt" SET vc = \'x\', tx = NULL')
        cur.execute(f'DELETE FROM "{t.schema}"."{cdc.db}__lk"')
    rid = cdc.request(DumpSpec("all", [f"{cdc.db}.lt", f"{cdc.db}.lk"], chunk_size=60, parallelism=2))
    assert cdc.dump_spark(rid)["status"] == "done"
    cdc.drain()
    assert all(r["status"] in ("applied", "empty") for r in _applied(cdc, "spark").values())
    _equal(cdc, "lt", "lk", "ok")
    with cdc.target() as t, t.conn.cursor() as cur:    # the bytes themselves, not only equal reads
        cur.execute(f'SELECT k FROM "{t.schema}"."{cdc.db}__lk" WHERE v = 1129')
        assert cur.fetchone()[0] == "D\x81"


@MARIADB
def test_the_latin1_codec_is_the_servers(make_cdc, src_db):
    """Every byte decodes as MariaDB converts it to UTF-8 (cp1252 but for five bytes)."""
    from airflow_provider_dblog.engine.sources.mysql.types import NativeColumn

    n = NativeColumn("c", "varchar", "varchar(1)", "string", charset="latin1")
    with src_db.cursor() as cur:
        for b in range(256):
            cur.execute(f"SELECT CONVERT(CAST(X'{b:02X}' AS CHAR CHARACTER SET latin1) USING utf8mb4)")
            assert bytes([b]).decode(n.encoding) == cur.fetchone()[0], hex(b)


@MARIADB
def test_a_value_its_codec_cannot_decode_holds_its_table_only(make_cdc, src_db):
    """sjis: Python's shift_jis has no character for 0xF040 (MariaDB stores it; single-byte
    character sets decode as the server does, tests/integration/test_mysql_charsets.py)."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "gr", "id INT PRIMARY KEY, g VARCHAR(8) CHARACTER SET sjis")
        src_db.create_table(cur, "ok", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["gr", "ok"])
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO gr VALUES (1, 'a'), (2, X'61F04062'), (3, 'c')")
        cur.execute("INSERT INTO ok VALUES (1, 1), (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None                  # the tail went on
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO ok VALUES (3, 3)")
    cdc.drain()
    assert cdc.tail_error is None
    res = _applied(cdc)
    assert res[f"{cdc.db}.ok"]["status"] == "applied" and res[f"{cdc.db}.ok"]["inserted"] == 3
    gr = res[f"{cdc.db}.gr"]
    assert gr["status"] == "held", gr
    assert f"{cdc.db}.gr.g" in gr["held"]["error"] and "61f04062" in gr["held"]["error"], gr
    held = status(cdc.cfg, "src")["held"]
    assert list(held["tgt"]) == [f"{cdc.db}.gr"], held
    # fixed at the source: the table flows again
    with src_db.cursor() as cur:
        cur.execute("UPDATE gr SET g = 'b' WHERE id = 2")
    cdc.drain()
    assert _applied(cdc)[f"{cdc.db}.gr"]["status"] == "applied"
    _equal(cdc, "gr", "ok")


# -- INVISIBLE columns ---------------------------------------------------------------------
@MARIADB
def test_an_invisible_column_is_carried_by_every_path(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, a INT, hidden VARCHAR(10) INVISIBLE")
        cur.execute("INSERT INTO t (id, a, hidden) SELECT seq, seq, CONCAT('h', seq) FROM seq_1_to_50")
    cdc = make_cdc(["t"])
    assert not cdc.source.check(scan_values=True)
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("ALTER TABLE t ADD COLUMN secret INT INVISIBLE")
        cur.execute("INSERT INTO t (id, a, hidden, secret) SELECT seq, seq, 'log', seq * 2 FROM seq_51_to_60")
        cur.execute("UPDATE t SET secret = id + 1000 WHERE id <= 20")
    cdc.drain()
    assert cdc.tail_error is None
    cdc.source.refresh_schema(f"{cdc.db}.t")
    rid = cdc.request(DumpSpec("all", [f"{cdc.db}.t"], chunk_size=15, parallelism=2))
    assert cdc.dump_spark(rid)["status"] == "done"
    cdc.drain()
    assert _applied(cdc)[f"{cdc.db}.t"]["status"] == "applied"
    _equal(cdc, "t")
    # a key-list dump into a damaged target
    with cdc.target() as t, t.conn, t.conn.cursor() as cur:
        cur.execute(f'UPDATE "{t.schema}"."{cdc.db}__t" SET secret = NULL, hidden = NULL')
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[i] for i in range(1, 61)], chunk_size=25))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    cdc.drain()
    assert _applied(cdc)[f"{cdc.db}.t"]["status"] == "applied"
    _equal(cdc, "t")
    with cdc.target() as t, t.conn.cursor() as cur:
        cur.execute(f'SELECT secret, hidden FROM "{t.schema}"."{cdc.db}__t" WHERE id = 7')
        assert cur.fetchone() == (1007, "h7")


# -- ENUM keys -----------------------------------------------------------------------------
ENUMS = {"e": "ENUM('zeta','alpha','mid')",
         "c": "ENUM('Zeta','alpha','MID')"}   # labels that are not lower case (compared as stored)


@MARIADB
def test_an_enum_key_out_of_label_order_is_dumped_completely(make_cdc, src_db):
    """Keys (enum, int) and (enum): many small chunks on Spark, under a writer that inserts
    into every label's range, updates and deletes throughout the dump."""
    with src_db.cursor() as cur:
        for t, enum in ENUMS.items():
            labels = enum[5:-1]
            src_db.create_table(cur, t, f"k {enum} NOT NULL, k2 INT NOT NULL, v INT, PRIMARY KEY (k, k2)")
            cur.execute(f"INSERT INTO {t} SELECT ELT(seq % 3 + 1, {labels}), seq, seq FROM seq_1_to_240")
            src_db.create_table(cur, f"{t}1", f"k {enum} PRIMARY KEY, v INT")
            cur.execute(f"INSERT INTO {t}1 SELECT ELT(seq, {labels}), seq FROM seq_1_to_3")
    tables = [*ENUMS, *(f"{t}1" for t in ENUMS)]
    cdc = make_cdc(tables)
    cdc.start_tail()
    stop, errors, writes = threading.Event(), [], [0]

    def write():
        try:
            with src_db.cursor() as cur:
                for i in range(1000, 1300):   # bounded: rows inserted into the range end
                    if stop.is_set():
                        break
                    for t, enum in ENUMS.items():
                        cur.execute(f"INSERT INTO {t} VALUES (ELT(MOD(%s, 3) + 1, {enum[5:-1]}), %s, 0)", (i, i))
                        cur.execute(f"UPDATE {t} SET v = v + 1 WHERE k2 = %s", (i - 900,))
                        cur.execute(f"DELETE FROM {t} WHERE k2 = %s", (i - 950,))
                    writes[0] += 1
        except BaseException as e:
            errors.append(e)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_until(lambda: writes[0] > 20, 60, "writes before the dump")
        rid = cdc.request(DumpSpec("all", [f"{cdc.db}.{t}" for t in tables], chunk_size=17, parallelism=3))
        out = cdc.dump_spark(rid)
    finally:
        stop.set()
        writer.join(60)
    assert not errors, errors
    assert out["status"] == "done", out
    for t in ENUMS:
        progress = cdc.state.progress(rid, f"{cdc.db}.{t}")
        assert progress["done"] and progress["rows"] >= 150 and progress["chunks"] <= 1000 // 17, progress
    cdc.drain()
    assert all(r["status"] in ("applied", "empty") for r in _applied(cdc).values())
    _equal(cdc, *tables)


@MARIADB
def test_a_chunk_boundary_that_does_not_advance_fails_the_dump_at_once(make_cdc, src_db):
    """Whatever the key type: a plan whose end is not past the last completed chunk's."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t SELECT seq, seq FROM seq_1_to_30")
    cdc = make_cdc(["t"])
    src = cdc.source
    real = src.plan_chunk

    def plan_going_back(schema, after, upto, size, parts):   # a source whose order is not the key's
        plan = real(schema, after, upto, size, parts)
        if plan is not None and after is not None:
            back = (after[0] - 3,)
            return ChunkPlan(after=after, end=back, bounds=(after, back), rows=plan.rows)
        return plan
    src.plan_chunk = plan_going_back

    class Reader:
        def read(self, table, predicates, dest, keep_file=True):
            return src.select_keys(table, [(i,) for i in range(1, 31)])
    cdc.start_tail()
    runner = DumpRunner(src, cdc.state, cdc.store, Reader(), cdc.cfg.dump)
    rid = runner.submit(DumpSpec("table", [f"{cdc.db}.t"], chunk_size=10))
    with pytest.raises(DBLogError, match="does not advance"):
        runner.run(rid)
    req = cdc.state.request(rid)
    assert req["status"] == "failed" and "does not advance" in req["error"], req
    progress = cdc.state.progress(rid, f"{cdc.db}.t")
    assert progress["chunks"] == 1 and not progress.get("done"), progress
    wait_until(lambda: not cdc.state.open_windows(), 10, "no window left open")
