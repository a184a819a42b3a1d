"""A key given in any spelling the source accepts is the row the source holds under its own
text (bug 5 of stop 36: a key-list dump of PostgreSQL interval '24:00:00', held as '1 day',
or of MariaDB TIME '00:00:03', held as '00:00:03.000000', took the key for missing and its
delete removed the row from a PostgreSQL target, which matches keys by value).

Generated: interval and TIME spellings (units, signs, fractions, ISO 8601, MariaDB's
'D HH:MM:SS' and 'HHMMSS'); the source's own equality decides, and the engine's key
matching (``Source.canonical_keys`` then ``keys.value_keys``) must agree with it exactly.
Then key-list dumps of random spellings of present and absent keys, end to end, lose no row."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.errors import InvalidKeyError
from airflow_provider_dblog.engine.keys import value_keys
from airflow_provider_dblog.engine.requests import DumpSpec

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


# -- spellings -------------------------------------------------------------------------------
def _pg_spelling(draw, months: int, days: int, us: int) -> str:
    style = draw(st.sampled_from(["units", "hms", "iso"]))
    if style == "units":
        return f"{months} mons {days} days {us} microseconds"
    sign, a = ("-" if us < 0 else ""), abs(us)
    hms = f"{sign}{a // 3_600_000_000}:{a // 60_000_000 % 60:02d}:{a // 1_000_000 % 60:02d}.{a % 1_000_000:06d}"
    if style == "hms":
        return f"{months} mons {days} days {hms}"
    return f"P{months}M{days}DT{us / 1e6:.6f}S"


@st.composite
def pg_interval_pairs(draw) -> tuple[str, str]:
    """Two interval literals PostgreSQL reads, each in one of several spellings: half the
    time the second is the first's value moved between months, days and microseconds
    (equal to it for PostgreSQL: a month is 30 days, a day 24 hours), else another value."""
    months = draw(st.integers(-14, 14))
    days = draw(st.sampled_from([0, 1, -1, 30, -30, 2, 360]))
    us = draw(st.sampled_from([0, 1, -1, 1_500_000, 86_400_000_000, -86_400_000_000, 3_600_000_000]))
    if draw(st.booleans()):
        to_days, to_us = draw(st.integers(-2, 2)), draw(st.integers(-3, 3))
        other = (months - to_days, days + 30 * to_days - to_us, us + to_us * 86_400_000_000)
    else:
        other = (draw(st.integers(-14, 14)), draw(st.sampled_from([0, 1, 30, -1])),
                 draw(st.sampled_from([0, 1, 86_400_000_000, -1_500_000])))
    return _pg_spelling(draw, months, days, us), _pg_spelling(draw, *other)


@st.composite
def time_literals(draw) -> str:
    """A TIME literal MariaDB reads, in one of its spellings."""
    us = draw(st.sampled_from([0, 1, 3_000_000, 3_000_001, 90_000_000_000, 3_600_000_000, 1_500_000,
                               838 * 3_600_000_000 + 59 * 60_000_000 + 59_000_000]))
    sign = draw(st.sampled_from(["", "-"])) if us else ""
    h, m, s, f = us // 3_600_000_000, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000
    frac = draw(st.sampled_from(["", f".{f:06d}", f".{f:06d}".rstrip("0")])) if f else draw(
        st.sampled_from(["", ".0", ".000000"]))
    style = draw(st.sampled_from(["hms", "short", "days", "packed"]))
    if style == "hms":
        return f"{sign}{h:02d}:{m:02d}:{s:02d}{frac}"
    if style == "short":
        return f"{sign}{h}:{m}:{s}{frac}"
    if style == "days" and h < 24 * 34:
        return f"{sign}{h // 24} {h % 24:02d}:{m:02d}:{s:02d}{frac}"
    return f"{sign}{h:d}{m:02d}{s:02d}{frac}"


def _same_by_engine(source, schema, a: str, b: str) -> bool:
    (ka,), (kb,) = source.canonical_keys(schema, [(a,), (b,)])
    va, vb = value_keys(pa.array([schema.encode_key((ka,)), schema.encode_key((kb,))]), schema.key_types).to_pylist()
    return va == vb


# -- the source's equality and the engine's key matching agree ---------------------------------
def _engine_agrees_with_the_source(src_db, make_cdc, column_type: str, pairs, equal_sql: str) -> None:
    """Over generated pairs of spellings, the engine takes two keys of a ``column_type`` key
    for one exactly when the source's own ``equal_sql`` does, both sides met often."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "keyed", f"k {column_type} PRIMARY KEY, v int")
    cdc = make_cdc(["keyed"])
    schema = cdc.source.table_schema(f"{cdc.db}.keyed")
    seen = {"equal": 0, "different": 0}

    @SETTINGS
    @given(pair=pairs)
    def check(pair):
        a, b = pair
        (same,), = cdc.source._query(equal_sql, (a, b))
        assert _same_by_engine(cdc.source, schema, a, b) == bool(same), (a, b, same)
        seen["equal" if same else "different"] += 1
    check()
    assert seen["equal"] >= 5 and seen["different"] >= 5, seen   # both sides of the property were met


@POSTGRES
def test_interval_keys_match_exactly_when_postgresql_takes_them_for_one(src_db, make_cdc):
    _engine_agrees_with_the_source(src_db, make_cdc, "interval", pg_interval_pairs(),
                                   "SELECT %s::interval = %s::interval")


@MARIADB
def test_time_keys_match_exactly_when_mariadb_takes_them_for_one(src_db, make_cdc):
    _engine_agrees_with_the_source(src_db, make_cdc, "TIME(6)", st.tuples(time_literals(), time_literals()),
                                   "SELECT CAST(%s AS TIME(6)) = CAST(%s AS TIME(6))")


@MARIADB
def test_a_time_key_the_server_cannot_read_is_refused(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "k TIME PRIMARY KEY, v int")
    cdc = make_cdc(["t"])
    with pytest.raises(InvalidKeyError, match=r"reads '12:61:00' as no time value"):
        cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], [["00:00:01"], ["12:61:00"]]))


# -- end to end: key-list dumps of other spellings lose no row ----------------------------------
CASES = {
    "postgres": ("i", "k interval PRIMARY KEY, v int",
                 ["1 day", "00:00:03", "1 mon", "-1 days +02:00:00", "838:59:59", "1 year 2 mons"]),
    "mariadb": ("t", "k TIME(6) PRIMARY KEY, v int",
                ["00:00:03", "-00:00:01.5", "25:00:00", "838:59:59", "00:00:00.000001", "-838:59:58.999999"]),
}


@pytest.mark.parametrize("src_db", ["postgres", "mariadb"], indirect=True)
def test_key_list_dumps_of_other_spellings_keep_every_row(src_db, make_cdc, request):
    kind = request.node.callspec.params["src_db"]
    name, columns, held = CASES[kind]
    with src_db.cursor() as cur:
        src_db.create_table(cur, name, columns)
        for v, k in enumerate(held):
            cur.execute(f"INSERT INTO {name} VALUES (%s, %s)", (k, v))
    cdc = make_cdc([name])
    cdc.start_tail()
    cdc.dump_local(name)
    cdc.apply_local()
    cdc.assert_equal(name)
    rng = random.Random(38)
    for round_no in range(3):
        # held keys in another spelling the source reads as them, and keys it lacks
        asked = [cdc.source._query(RESPELL[kind][rng.randrange(2)], (k,))[0][0] for k in rng.sample(held, 3)]
        asked += [ABSENT[kind](rng) for _ in range(2)]
        rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.{name}"], [[k] for k in asked]))
        cdc.dump_local(name, rid)
        cdc.apply_local()
        cdc.assert_equal(name)
        with src_db.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {name}")
            (n,) = cur.fetchone()
        assert n == len(held), (round_no, asked)


# keys the table may lack (when it holds one, it is dumped as itself)
ABSENT = {
    "postgres": lambda rng: f"{rng.randint(-50, 50)} days {rng.randint(0, 23)}:00:0{rng.randint(0, 9)}",
    "mariadb": lambda rng: f"{rng.randint(100, 800)}:{rng.randint(0, 59):02d}:00.{rng.randint(0, 9)}",
}

# other texts of a value, printed by the source itself
RESPELL = {
    "postgres": ["SELECT (%s::interval - interval '1 day' + interval '24 hours')::text",
                 "SELECT justify_interval(%s::interval)::text"],
    "mariadb": ["SELECT CAST(CAST(%s AS TIME(6)) + 0 AS CHAR)",
                "SELECT TRIM(TRAILING '0' FROM CAST(CAST(%s AS TIME(6)) AS CHAR))"],
}
