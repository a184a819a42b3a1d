"""Breaking today's changes (generated inputs, real servers).

1. apply_run.apply_tables: one table's own apply error stops only that table (the first,
   the last, two of them, its orphan sweep; local and Spark); a target away, a lost lease or
   lost state still stop the whole run.
2. PostgreSQL key_texts (canonical_keys / equal_keys): composite keys mixing text-typed
   columns (jsonb, numeric[], text[], int[], inet, cidr, uuid, macaddr, interval, timetz,
   citext) with int/numeric/timestamp/bytea/bool columns, in other spellings, absent, changed
   inside the dump window, thousands at a time: a key-list dump deletes exactly the
   requested keys the source lacks.
3. MariaDB key_texts: TIME(0..6) keys in clean, warned and too-fine spellings.
Bugs this round found, fixed in stop 38 (their tests pass): warnings read with SHOW COUNT(*)
WARNINGS were another statement's (now the CAST's own count); TIME keys MariaDB reads only in
part kept as given, so its WHERE and a PostgreSQL target's delete read them as different values
('2 days': 00:00:02 / 48:00:00): now a text engine/values.interval_key_us reads is taken by that
value and any other is read by the server and refused when warned or finer than the column;
the retry clock carried from one table's outage to the next table (retry.Retrier.run).
"""
from __future__ import annotations

import contextlib
import itertools
import random
import time

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine import apply_batch
from airflow_provider_dblog.engine.errors import (InvalidKeyError, LeaseLostError, StateLostError, TablesNotAppliedError,
                                                  TargetUnavailableError)
from airflow_provider_dblog.engine.events import event_arrow_schema
from airflow_provider_dblog.engine.reconcile import reconcile
from airflow_provider_dblog.engine.requests import DumpSpec, validate_spec
from airflow_provider_dblog.engine.targets import PostgresTarget, target_table_name

from helpers import mysql_connect, pg_connect

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)


# == 1. one table's failure =====================================================================
def _setup_tables(src_db, make_cdc, tables, **overrides):
    with src_db.cursor() as cur:
        for n in tables:
            src_db.create_table(cur, n, "id INT PRIMARY KEY, v INT")
            cur.execute(f"INSERT INTO {n} VALUES (1, 1)")
    cdc = make_cdc(tables, **overrides)
    cdc.start_tail()
    for n in tables:
        cdc.dump_local(n)
    cdc.apply_local()
    return cdc


def _target_sql(cdc, table: str, statement: str) -> None:
    """``statement`` with {t} the table's target table, by hand in the warehouse."""
    tcfg = cdc.cfg.target("tgt")
    name = target_table_name(cdc.source.table_schema(f"{cdc.db}.{table}"))
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:
        cur.execute(sql.SQL(statement).format(t=sql.Identifier(tcfg.schema, name)))


def _positions(cdc, tables):
    with cdc.target() as tgt:
        return {n: tgt.applied_pos("src", cdc.source.table_schema(f"{cdc.db}.{n}")) for n in tables}


@MARIADB
def test_first_and_last_tables_failing_stop_only_themselves(src_db, make_cdc):
    """Failing tables at both ends of the run (and two at once): the middle one is applied,
    each failed one keeps its position, the first failure is the cause; fixed, all converge."""
    tables = ["a", "m", "z"]
    cdc = _setup_tables(src_db, make_cdc, tables)
    for n in ("a", "z"):
        _target_sql(cdc, n, "ALTER TABLE {t} ADD CONSTRAINT small CHECK (v < 100)")
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 500)")
    cdc.drain()
    before = _positions(cdc, tables)
    with pytest.raises(TablesNotAppliedError, match=r"2 table\(s\) failed, the other 1 went on") as caught:
        cdc.apply_local()
    results = caught.value.results
    assert [results[f"{cdc.db}.{n}"]["status"] for n in tables] == ["failed", "applied", "failed"], results
    assert isinstance(caught.value.__cause__, psycopg2.errors.CheckViolation)
    assert f"{cdc.db}.a" in str(caught.value) and f"{cdc.db}.z" in str(caught.value)
    after = _positions(cdc, tables)
    assert after["a"] == before["a"] and after["z"] == before["z"] and after["m"] > before["m"]
    cdc.assert_equal("m")
    for n in ("a", "z"):
        _target_sql(cdc, n, "ALTER TABLE {t} DROP CONSTRAINT small")
    cdc.apply_local()
    cdc.assert_equal(*tables)


@MARIADB
def test_a_failing_orphan_sweep_stops_only_its_table_and_runs_again(src_db, make_cdc):
    """A full dump's sweep that cannot delete an orphan (a foreign key in the warehouse
    refers to it): the table fails, the other is applied; fixed, the sweep still runs."""
    tables = ["s", "o"]
    cdc = _setup_tables(src_db, make_cdc, tables)
    tcfg = cdc.cfg.target("tgt")
    name = target_table_name(cdc.source.table_schema(f"{cdc.db}.s"))
    _target_sql(cdc, "s", "INSERT INTO {t} (id, v, _dblog_pos) VALUES (99, 99, '')")   # an orphan
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {}.refs (id int REFERENCES {}.{} (id))").format(
            sql.Identifier(tcfg.schema), sql.Identifier(tcfg.schema), sql.Identifier(name)))
        cur.execute(sql.SQL("INSERT INTO {}.refs VALUES (99)").format(sql.Identifier(tcfg.schema)))
    cdc.dump_local("s")
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO o VALUES (2, 2)")
    cdc.drain()
    with pytest.raises(TablesNotAppliedError, match=rf"{cdc.db}\.s: ForeignKeyViolation") as caught:
        cdc.apply_local()
    assert caught.value.results[f"{cdc.db}.o"]["status"] == "applied", caught.value.results
    cdc.assert_equal("o")
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE {}.refs").format(sql.Identifier(tcfg.schema)))
    res = cdc.apply_local()
    assert res[f"{cdc.db}.s"].get("orphans_deleted") == 1, res
    cdc.assert_equal(*tables)


@MARIADB
@pytest.mark.parametrize("error", [TargetUnavailableError("target away"), LeaseLostError("lease lost"),
                                   StateLostError("state lost")], ids=lambda e: type(e).__name__)
def test_errors_of_the_run_itself_stop_every_table(src_db, make_cdc, monkeypatch, error):
    tables = ["a", "b", "c"]
    cdc = _setup_tables(src_db, make_cdc, tables)
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 2)")
    cdc.drain()
    before = _positions(cdc, tables)
    seen = []
    real = apply_batch.LocalApplier.apply_table

    def apply_table(self, schema):
        seen.append(schema.name)
        if schema.name == "b":
            raise error
        return real(self, schema)
    monkeypatch.setattr(apply_batch.LocalApplier, "apply_table", apply_table)
    with pytest.raises(type(error)):
        cdc.apply_local()
    assert seen == ["a", "b"], seen   # c is not tried
    after = _positions(cdc, tables)
    assert after["a"] > before["a"] and after["b"] == before["b"] and after["c"] == before["c"]


@MARIADB
def test_a_target_that_stays_away_stops_the_run_as_target_unavailable(src_db, make_cdc, monkeypatch):
    """Connection errors past apply.retry_for_s: TargetUnavailableError, not a per-table failure."""
    tables = ["a", "b"]
    cdc = _setup_tables(src_db, make_cdc, tables, apply={"retry_for_s": 1.0})
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO a VALUES (2, 2)")
    cdc.drain()
    calls = []

    def down(self, *a, **k):
        calls.append(1)
        raise psycopg2.OperationalError("server closed the connection unexpectedly")
    monkeypatch.setattr(PostgresTarget, "applied_pos", down)
    t0 = time.monotonic()
    with pytest.raises(TargetUnavailableError):
        cdc.apply_local()
    assert time.monotonic() - t0 < 30 and len(calls) >= 2


@MARIADB
def test_a_table_failing_after_an_outage_leaves_the_next_table_its_own_retry_budget(src_db, make_cdc, monkeypatch):
    tables = ["a", "b"]
    cdc = _setup_tables(src_db, make_cdc, tables, apply={"retry_for_s": 1.5})
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 2)")
    cdc.drain()
    calls = {"a": 0, "b": 0}
    real = apply_batch.LocalApplier.apply_table

    def apply_table(self, schema):
        calls[schema.name] += 1
        if calls[schema.name] == 1:   # each table's first attempt meets the target restarting
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        if schema.name == "a":        # then a fails for a reason of its own, after a while
            time.sleep(1.6)
            raise ValueError("a's own failure")
        return real(self, schema)
    monkeypatch.setattr(apply_batch.LocalApplier, "apply_table", apply_table)
    with pytest.raises(TablesNotAppliedError, match=r"1 table\(s\) failed.*a's own failure") as caught:
        cdc.apply_local()
    assert caught.value.results[f"{cdc.db}.b"]["status"] == "applied", caught.value.results
    cdc.assert_equal("b")


@MARIADB
def test_spark_apply_with_a_failing_table_fails_the_job_and_applies_the_others(src_db, make_cdc):
    from airflow_provider_dblog.engine.jobs import SparkJobError
    tables = ["a", "t", "u"]
    cdc = _setup_tables(src_db, make_cdc, tables)
    _target_sql(cdc, "t", "ALTER TABLE {t} ADD CONSTRAINT small CHECK (v < 100)")
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 500)")
    cdc.drain()
    before = _positions(cdc, tables)
    with pytest.raises(SparkJobError, match=rf"TablesNotAppliedError.*1 table\(s\) failed.*{cdc.db}\.t: CheckViolation"):
        cdc.apply_spark("tgt")
    after = _positions(cdc, tables)
    assert after["t"] == before["t"] and after["a"] > before["a"] and after["u"] > before["u"]
    cdc.assert_equal("a", "u")


# == 3. MariaDB TIME keys ======================================================================
TIME_MAX_US = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999


def _time_spellings():
    """TIME literals in many spellings: MariaDB reads each cleanly, with a warning, or not at all."""
    for us in (0, 3_000_000, 1_500_000, 100_000_000, 3_720_000_000, 90_000_000_000, 172_800_000_000,
               1_999_999, 1_000_001, 250_000, TIME_MAX_US - 999_999):
        for sign in ("", "-") if us else ("",):
            h, m, s, f = us // 3_600_000_000, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000
            fracs = {"", f".{f:06d}", f".{f:06d}".rstrip("0") or ".0", f".{f:06d}0", f".{f:06d}9"} if f else \
                {"", ".0", ".000000", ".0000001", ".9999999"}
            for frac in sorted(fracs):
                yield f"{sign}{h:02d}:{m:02d}:{s:02d}{frac}"      # hms
                yield f"{sign}{h}:{m}:{s}{frac}"                  # short
                if h < 24 * 34:
                    yield f"{sign}{h // 24} {h % 24:02d}:{m:02d}:{s:02d}{frac}"   # D HH:MM:SS
                yield f"{sign}{h:d}{m:02d}{s:02d}{frac}"          # packed
            if not f and not m and not s:
                yield f"{sign}{h}:{m}"                            # HH:MM
    # spellings a user might type, read only in part (a warning) or differently by PostgreSQL
    yield from ["2 days", "1 day", "2.5 days", "01:00:00abc", "1 2", "12:00:00 ", " 12:00", "+01:00:00",
                "900:00:00", "838:59:59.9999999", "00:00:01.9999999", "00:00:01.0000001", "1.5", "-1.5",
                "100", "3", "1e2", "00:60:00", "--1"]


def _readings(texts):
    """{text: (microseconds or None, warned)}: MariaDB's reading of each as TIME(6) (its
    WHERE's), PostgreSQL's reading as an interval (a PostgreSQL target's delete's), None
    where it cannot read it."""
    out = {}
    with mysql_connect() as my, my.cursor() as cur, contextlib.closing(pg_connect()) as pg, pg.cursor() as pcur:
        for text in texts:
            cur.execute("SELECT COUNT(*) FROM mysql.user")   # a statement using a table clears the warnings
            cur.fetchall()
            cur.execute("SELECT CAST(%s AS TIME(6))", (text,))
            (v,) = cur.fetchone()
            cur.execute("SHOW COUNT(*) WARNINGS")
            (warned,) = cur.fetchone()
            try:
                pcur.execute("SELECT (extract(epoch FROM %s::interval) * 1000000)::bigint", (text,))
                (p,) = pcur.fetchone()
            except psycopg2.Error:
                p = None
            out[text] = (None if v is None else (v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds,
                         bool(warned), p)
    return out


def _holdable(us, fsp: int) -> bool:
    return us is not None and abs(us) <= TIME_MAX_US and us % 10 ** (6 - fsp) == 0


FSPS = (0, 1, 3, 6)


def _time_table(src_db, make_cdc):
    with src_db.cursor() as cur:
        for fsp in FSPS:
            src_db.create_table(cur, f"t{fsp}", f"k TIME({fsp}) PRIMARY KEY, v int")
    return make_cdc([f"t{fsp}" for fsp in FSPS])


def _reset_warnings(cdc, schema) -> None:
    cdc.source._query(f"SELECT COUNT(*) FROM `{schema.database}`.`{schema.name}`")


def _unsafe_time_keys(cdc, warned_ones: bool):
    """Spellings (of the class asked: MariaDB reads them with a warning or not) that
    canonical_keys accepts though its text is read as one value by MariaDB's WHERE and as
    another by a PostgreSQL target's delete, the latter a value a TIME(fsp) row can hold (the
    delete would remove a row the source holds), or not at all (its apply would fail for
    good). Refused ones (InvalidKeyError, a clear error) are safe. Each asked alone, then all
    the accepted ones in one request (the same texts: nothing carries over between keys)."""
    texts = list(dict.fromkeys(_time_spellings()))
    read = _readings(texts)
    bad, seen, refused = [], 0, 0
    for fsp in FSPS:
        schema = cdc.source.table_schema(f"{cdc.db}.t{fsp}")
        asked = [t for t in texts if read[t][0] is None or read[t][1] == warned_ones]
        alone = {}
        for t in asked:
            try:
                alone[t] = cdc.source.canonical_keys(schema, [(t,)])[0][0]
            except InvalidKeyError as e:
                assert "the server reads" in str(e), str(e)
                refused += 1
        together = [k[0] for k in cdc.source.canonical_keys(schema, [(t,) for t in alone])]
        assert together == list(alone.values()), fsp
        more = _readings([c for c in alone.values() if c not in read])
        for t, c in alone.items():
            seen += 1
            my_us, warned, pg_us = read.get(c) or more[c]
            if pg_us is not None and ((my_us == pg_us and not warned) or not _holdable(pg_us, fsp)):
                continue   # one value for both, or none a row can hold
            bad.append((fsp, t, c, my_us, pg_us))
    assert seen + refused > 100 and (seen > 400 or warned_ones) and (refused > 0 or not warned_ones), (seen, refused)
    return bad


@MARIADB
def test_time_keys_read_cleanly_are_canonical_or_no_rows_value(src_db, make_cdc):
    cdc = _time_table(src_db, make_cdc)
    bad = _unsafe_time_keys(cdc, warned_ones=False)
    assert not bad, bad[:20]


@MARIADB
def test_time_keys_read_with_a_warning_are_refused_or_read_alike(src_db, make_cdc):
    """(Round 2 found: such keys kept as given, '2 days' read as 00:00:02 by MariaDB and as
    48:00:00 by the target's delete; '01:00:00abc' unreadable by the target.)"""
    cdc = _time_table(src_db, make_cdc)
    bad = _unsafe_time_keys(cdc, warned_ones=True)
    assert not bad, bad[:20]


@MARIADB
def test_key_list_dump_of_odd_time_spellings_keeps_every_row(src_db, make_cdc):
    """Key-list dumps of spellings MariaDB warns about or reads otherwise than PostgreSQL:
    each refused with a clear error, or dumped without losing a row (single and composite key)."""
    held = ["00:00:01", "00:00:02", "48:00:00", "01:02:00", "00:01:40"]
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "k TIME PRIMARY KEY, v int")
        src_db.create_table(cur, "c", "k TIME(3), i INT, v int, PRIMARY KEY (k, i)")   # composite
        for v, k in enumerate(held):
            cur.execute("INSERT INTO t VALUES (%s, %s)", (k, v))
            cur.execute("INSERT INTO c VALUES (%s, 7, %s)", (k, v))
    cdc = make_cdc(["t", "c"])
    cdc.start_tail()
    for name in ("t", "c"):
        cdc.dump_local(name)
    cdc.apply_local()
    cdc.assert_equal("t", "c")
    lost, refused = {}, []
    for name, asked in itertools.product(("t", "c"), (["2 days"], ["00:00:01.0000001"], ["00:00:01.9999999"],
                                                        ["2 days", "1:2", "100"], ["01:00:00abc"])):
        keys = [[k] if name == "t" else [k, 7] for k in asked]
        try:
            rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.{name}"], keys))
        except InvalidKeyError as e:
            refused.append((name, *asked, str(e)))
            continue
        cdc.dump_local(name, rid)
        cdc.apply_local()
        diff = cdc.compare(name)
        if not diff.equal:
            lost[(name, *asked)] = diff.describe()
            cdc.dump_local(name)   # repaired for the next round
            cdc.apply_local()
    assert not lost, "\n".join(f"{k}: {v}" for k, v in lost.items())
    assert {r[1] for r in refused} >= {"00:00:01.0000001", "01:00:00abc"}, refused


# == 2. PostgreSQL key texts =====================================================================
LONG = "x" * 1500
# type: (the stored text, other spellings of the same value, texts of other values)
PG_TEXT_KEYS = {
    "jsonb": ('{"a": 1.0, "s": "q\\"b\\\\{},é"}',
              ['{"s":"q\\"b\\\\{},é","a":1}', '{"a": 1.000, "s": "q\\"b\\\\{},\\u00e9"}', '{"a":1e0,"s":"q\\"b\\\\{},é"}'],
              ['{"a": 2, "s": "q\\"b\\\\{},é"}', '{"a": 1.0}', '[]']),
    "numeric[]": ("{1.5,2,-0}", ["{1.50,2.0,0}", "{ 1.5 , 2 , 0.000 }", "[1:3]={1.5,2,0}"],
                  ["{1.5}", "{2,1.5,0}", "[0:2]={1.5,2,0}", "{{1.5,2,0}}"]),
    "text[]": ('{"a,b","c\\"d","{e}",é,"","f\\\\g"}', ['{"a,b","c\\"d","{e}","é","","f\\\\g"}',
                                                  '{ "a,b" , c\\"d , "{e}" , "\\é" , "" , f\\\\g }'],
               ['{"a,b"}', '{a,b,"c\\"d","{e}",é,"","f\\\\g"}']),
    "int[]": ("{1,2}", ["{ 1 , 2 }", "[1:2]={1,2}", "{+1,02}"], ["[0:1]={1,2}", "{{1,2}}", "{2,1}"]),
    "inet": ("10.0.0.1", ["10.0.0.1/32"], ["10.0.0.1/24", "10.0.0.2"]),
    "cidr": ("10.0.0.0/8", ["10/8", "10.0/8"], ["10.0.0.0/16"]),
    "uuid": ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
             ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "{a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11}",
              "a0eebc999c0b4ef8bb6d6bb9bd380a11"], ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12"]),
    "macaddr": ("08:00:2b:01:02:03", ["08-00-2B-01-02-03", "0800.2b01.0203", "08002b010203"], ["08:00:2b:01:02:04"]),
    "interval": ("1 day", ["24:00:00", "1440 minutes", "P1D", "@ 1 day", "0.5 days 12:00:00"], ["25:00:00", "1 mon"]),
    "timetz": ("12:00:00+01", ["12:00+01", "12:00:00+01:00", "12:00:00.000+01"], ["11:00:00+00", "12:00:00+02"]),
    "citext": ("Abc", ["aBC", "ABC"], ["Abd", "Abc "]),
    "varbit": ("101", ["101"], ["1010", "0101"]),
    "long jsonb": (f'{{"k": "{LONG}", "n": 1.0}}', [f'{{"n": 1.00, "k": "{LONG}"}}'], [f'{{"k": "{LONG}", "n": 2}}']),
}
# the other key columns: n numeric, ts timestamp, b bytea, f bool, tz timestamptz, d float8, i int
TS, TZ = "2020-01-02 03:04:05.5", "2020-01-02 03:04:05.5+00"
OTHER_HELD = ("1.5", TS, b"\x00\xff\\'", True, TZ, 0.0)
OTHER_SAME = [["1.50", "2020-01-02T03:04:05.500000", "0x00FF5C27", True, "2020-01-02T04:04:05.500+01:00", -0.0],
              ["1.5", TS, "0x00ff5c27", True, TZ, 0]]
OTHER_DIFF = [["1.6", TS, "0x00ff5c27", True, TZ, 0.0], ["1.5", "2020-01-02 03:04:05", "0x00ff5c27", True, TZ, 0.0],
              ["1.5", TS, "0x00ff", True, TZ, 0.0], ["1.5", TS, "0x00ff5c27", False, TZ, 0.0],
              ["1.5", TS, "0x00ff5c27", True, "2020-01-02 03:04:05.5+01", 0.0], ["1.5", TS, "0x00ff5c27", True, TZ, 1e-300]]
ROWS_PER_TYPE = 3   # i = 1..3


def _pg_key_tables(src_db, make_cdc):
    with src_db.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext SCHEMA public")
        cur.execute("SET search_path TO app, public")
        for j, (typ, (held, _, _)) in enumerate(PG_TEXT_KEYS.items()):
            sql_type = "jsonb" if typ == "long jsonb" else typ
            src_db.create_table(cur, f"k{j}", f"t {sql_type}, n numeric, ts timestamp, b bytea, f bool, tz timestamptz, "
                                              "d float8, i int, v int, PRIMARY KEY (t, n, ts, b, f, tz, d, i)")
            for i in range(1, ROWS_PER_TYPE + 1):
                cur.execute(f"INSERT INTO k{j} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", (held, *OTHER_HELD, i, i))
    return make_cdc([f"k{j}" for j in range(len(PG_TEXT_KEYS))])


def _pg_requested(rng):
    """Per type: requested keys, each with whether the source holds it (by its own '=')."""
    for typ, (held, same, diff) in PG_TEXT_KEYS.items():
        keys = []
        for t in [held, *same]:
            for other in OTHER_SAME:
                keys.append(([t, *other, rng.randint(1, ROWS_PER_TYPE)], True))
            for other in OTHER_DIFF:
                keys.append(([t, *other, 1], False))
            keys.append(([t, *OTHER_SAME[0], ROWS_PER_TYPE + 1], False))
        for t in diff:
            keys.append(([t, *OTHER_SAME[1], 1], False))
        rng.shuffle(keys)
        yield typ, keys


def _dump_missing(cdc, table: str, keys: list[list]):
    """The requested keys a key-list dump would delete (its reconcile, nothing in the window)."""
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    spec = validate_spec(cdc.source, DumpSpec("keys", [f"{cdc.db}.{table}"], keys), cdc.cfg.dump)
    requested = [schema.parse_key(k) for k in spec.keys]
    chunk = cdc.source.select_keys(schema, requested)
    hw, _ = cdc.source.current_resume()
    res = reconcile(schema, chunk, event_arrow_schema(schema).empty_table(), hw, requested_keys=requested,
                    equal_keys=lambda a, b: cdc.source.equal_keys(schema, a, b))
    return {schema.encode_key(k) for k in res.missing}, res


@POSTGRES
def test_key_list_dump_deletes_exactly_the_absent_composite_keys(src_db, make_cdc):
    """Each requested key alone, then all of a table's at once: deleted exactly when the
    source's own '=' finds no row. (citext is carried as a plain string, its target column
    is text: a key in another case is deleted as such, which no target row matches.)"""
    cdc = _pg_key_tables(src_db, make_cdc)
    rng = random.Random(7)
    bad, n = [], 0
    for j, (typ, keys) in enumerate(_pg_requested(rng)):
        table = f"k{j}"
        alone = set()
        for key, held in keys:
            missing, _ = _dump_missing(cdc, table, [key])
            alone |= missing
            n += 1
            if bool(missing) == held and typ != "citext":
                bad.append((typ, key, "held" if held else "absent", sorted(missing)))
        missing, _ = _dump_missing(cdc, table, [k for k, _ in keys])   # all at once
        if missing != alone:
            bad.append((typ, "one request", sorted(missing ^ alone)))
    assert n > 300 and not bad, "\n".join(map(str, bad))


@POSTGRES
def test_key_list_dumps_with_changes_in_their_windows_keep_the_target_equal(src_db, make_cdc, monkeypatch):
    """End to end, every type: a key-list dump of held keys in other spellings (inside the
    dump's window one row deleted, one updated, one re-inserted under another spelling of its key),
    of keys the target holds as extra rows (deleted) and of keys nobody holds."""
    cdc = _pg_key_tables(src_db, make_cdc)
    cdc.start_tail()
    names = [f"k{j}" for j in range(len(PG_TEXT_KEYS))]
    for name in names:
        cdc.dump_local(name)
    cdc.apply_local()
    tcfg = cdc.cfg.target("tgt")
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:   # extra target rows
        for name, (typ, (_, _, diff)) in zip(names, PG_TEXT_KEYS.items()):
            t = sql.Identifier(tcfg.schema, target_table_name(cdc.source.table_schema(f"{cdc.db}.{name}")))
            cur.execute(sql.SQL("INSERT INTO {} (t, n, ts, b, f, tz, d, i, v, _dblog_pos) VALUES "
                                "(%s, %s, %s, %s, %s, %s, %s, 1, -1, '')").format(t), (diff[0], *OTHER_HELD))
    real = cdc.source.select_keys
    current = {}

    def select_keys(schema, keys):
        rows = real(schema, keys)
        current["hooked"] = current.get("hooked", 0) + 1
        same = PG_TEXT_KEYS[current["typ"]][1]
        with src_db.cursor() as cur:   # inside the window: after the select, before the HW
            cur.execute("SET search_path TO app, public")
            cur.execute(f"DELETE FROM {schema.name} WHERE i = 1")
            cur.execute(f"UPDATE {schema.name} SET v = v + 100 WHERE i = 2")
            cur.execute(f"DELETE FROM {schema.name} WHERE i = 3")
            cur.execute(f"INSERT INTO {schema.name} VALUES (%s, %s, %s, %s, %s, %s, %s, 3, 3)", (same[0], *OTHER_HELD))
        return rows
    monkeypatch.setattr(cdc.source, "select_keys", select_keys)
    rng = random.Random(11)
    for name, (typ, (held, same, diff)) in zip(names, PG_TEXT_KEYS.items()):
        current["typ"] = typ
        keys = [[rng.choice([held, *same]), *rng.choice(OTHER_SAME), i] for i in range(1, ROWS_PER_TYPE + 1)]
        keys += [[diff[0], *OTHER_SAME[1], 1], [rng.choice(diff), *OTHER_DIFF[0], 2]]
        cdc.dump_local(name, cdc.request(DumpSpec("keys", [f"{cdc.db}.{name}"], keys)))
    assert current["hooked"] == len(names), current
    cdc.apply_local()
    for name, typ in zip(names, PG_TEXT_KEYS):
        diff = cdc.compare(name)
        assert diff.equal, (typ, diff.describe())


@POSTGRES
@pytest.mark.parametrize("typ", ["jsonb", "numeric[]", "varbit"])
def test_a_key_list_of_thousands_of_respelled_keys(src_db, make_cdc, typ):
    """4,000 requested keys of a (text-typed, int) key: 2,000 held under other spellings (by
    value only), 2,000 absent, 40 of which the target holds as extra rows: quick, exact."""
    n = 2000
    held, asked, extra, extra_asked = {
        "jsonb": (lambda i: f'{{"a": {i}.0, "s": "é\\\\{i}"}}', lambda i: f'{{"s":"é\\\\{i}","a":{i}.00}}',
                  lambda i: f'{{"a": {i}.5}}', lambda i: f'{{"a":{i}.50}}'),
        "numeric[]": (lambda i: f"{{{i}.0,1}}", lambda i: f"{{ {i}.000 , 1.0 }}", lambda i: f"{{{i}.5}}",
                      lambda i: f"{{{i}.500}}"),
        "varbit": (lambda i: format(i, "b"), lambda i: format(i, "b"), lambda i: "0" + format(i, "b"),
                   lambda i: "0" + format(i, "b")),
    }[typ]
    with src_db.cursor() as cur:
        src_db.create_table(cur, "big", f"t {typ}, i int, v int, PRIMARY KEY (t, i)")
        cur.execute(f"INSERT INTO big SELECT x::{typ}, 1, 0 FROM unnest(%s::text[]) AS u(x)", ([held(i) for i in range(n)],))
    cdc = make_cdc(["big"])
    cdc.start_tail()
    cdc.dump_local("big")
    cdc.apply_local()
    tcfg = cdc.cfg.target("tgt")
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:
        t = sql.Identifier(tcfg.schema, target_table_name(cdc.source.table_schema(f"{cdc.db}.big")))
        cur.execute(sql.SQL("INSERT INTO {} (t, i, v, _dblog_pos) SELECT x::{}, 1, -1, '' "
                            "FROM unnest(%s::text[]) AS u(x)").format(t, sql.SQL(typ)), ([extra(i) for i in range(0, n, 50)],))
    keys = [[asked(i), 1] for i in range(n)] + [[extra_asked(i), 1] for i in range(n)]
    random.Random(3).shuffle(keys)
    t0 = time.monotonic()
    cdc.dump_local("big", cdc.request(DumpSpec("keys", [f"{cdc.db}.big"], keys)))
    took = time.monotonic() - t0
    cdc.apply_local()
    cdc.assert_equal("big")
    assert took < 20, took
