"""engine/values.py and engine/targets/pg_copy.py: exact carriers and text forms.

The vectorized parsers (``column_from_text``, Arrow casts for the plain forms) must give
exactly what the per-value parsers give (the tail parses value by value); the COPY
formatter must print what PostgreSQL reads back as the same value (checked against the
private PostgreSQL in tests/integration/test_type_fidelity.py; here against the parsers).
"""
from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.errors import UncarriedValueError, ZeroDateError
from airflow_provider_dblog.engine.keys import encode_key
from airflow_provider_dblog.engine.arrow_values import column_from_text, from_arrow, to_arrow
from airflow_provider_dblog.engine.targets.pg_copy import column_text, copy_text
from airflow_provider_dblog.engine.values import (
    INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, FarDate, FarTimestamp, civil_from_days,
    date_days, date_from_days, days_from_civil, float32, numeric_key, numeric_text, parse_mysql_datetime,
    parse_pg_date, parse_pg_timestamp, pg_date_text, pg_options, pg_set_statements, pg_timestamp_text,
    timestamp_from_us, timestamp_us)

# PostgreSQL's range: 4713 BC .. 5874897 AD (dates), .. 294276 AD (timestamps); Arrow's
# microseconds end in 294247
DAYS = st.integers(days_from_civil(-4712, 1, 1), days_from_civil(5874897, 12, 31))
MICROS = st.integers(days_from_civil(-4712, 1, 1) * 86_400_000_000, days_from_civil(294246, 12, 31) * 86_400_000_000)


@given(DAYS)
def test_civil_days_round_trip(days):
    y, m, d = civil_from_days(days)
    assert days_from_civil(y, m, d) == days
    if 1 <= y <= 9999:
        assert dt.date(y, m, d) == date_from_days(days)


def test_known_days():
    assert civil_from_days(0) == (1970, 1, 1)
    assert civil_from_days(days_from_civil(0, 2, 29)) == (0, 2, 29)      # 1 BC was a leap year
    assert pg_date_text(date_from_days(days_from_civil(0, 2, 29))) == "0001-02-29 BC"
    assert pg_date_text(date_from_days(days_from_civil(-43, 3, 15))) == "0044-03-15 BC"
    assert parse_pg_date("0044-03-15 BC") == FarDate(days_from_civil(-43, 3, 15))
    assert parse_pg_date("1582-10-10") == dt.date(1582, 10, 10)    # proleptic: no Julian jump
    assert (dt.date(1582, 10, 15) - dt.date(1582, 10, 4)).days == 11


@given(DAYS)
def test_pg_dates_round_trip_through_their_text(days):
    value = date_from_days(days)
    text = pg_date_text(value)
    assert parse_pg_date(text) == value and date_days(parse_pg_date(text)) == days


@given(MICROS, st.booleans())
def test_pg_timestamps_round_trip_through_their_text(us, aware):
    value = timestamp_from_us(us)
    text = pg_timestamp_text(value, aware)
    assert parse_pg_timestamp(text, aware) == value and timestamp_us(value) == us


def test_infinities_and_ranges():
    assert parse_pg_timestamp("infinity") == FarTimestamp(INT64_MAX)
    assert parse_pg_timestamp("-infinity", True) == FarTimestamp(INT64_MIN)
    assert parse_pg_date("infinity") == FarDate(INT32_MAX) and parse_pg_date("-infinity") == FarDate(INT32_MIN)
    assert pg_timestamp_text(FarTimestamp(INT64_MAX), True) == "infinity"
    assert pg_date_text(FarDate(INT32_MIN)) == "-infinity"
    assert parse_pg_timestamp("2024-01-01 12:00:00+05:30", True) == dt.datetime(2024, 1, 1, 6, 30)
    assert parse_pg_timestamp("0001-01-01 00:00:00+00 BC", True) == FarTimestamp(
        days_from_civil(0, 1, 1) * 86_400_000_000)
    with pytest.raises(UncarriedValueError, match="beyond the range"):
        parse_pg_timestamp("294276-12-31 23:59:59")
    with pytest.raises(ValueError):
        parse_pg_timestamp("2024-01-01 12:00:00+00")     # an offset on a timestamp without zone


def test_mysql_texts():
    assert parse_mysql_datetime("1000-01-01 00:00:00.000001") == dt.datetime(1000, 1, 1, 0, 0, 0, 1)
    assert parse_mysql_datetime("2024-02-29", date_only=True) == dt.date(2024, 2, 29)
    for zero in ("0000-00-00", "0000-00-00 00:00:00", "2024-00-10", "2024-01-00 00:00:00"):
        with pytest.raises(ZeroDateError):
            parse_mysql_datetime(zero, date_only=len(zero) == 10)
    with pytest.raises(UncarriedValueError, match="invalid date"):
        parse_mysql_datetime("2024-02-30")


def _ts_texts(dialect, aware):
    if dialect == "postgres":
        return MICROS.map(lambda us: pg_timestamp_text(timestamp_from_us(us), aware))
    return st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31)).map(
        lambda v: v.isoformat(sep=" ", timespec=("seconds", "microseconds")[v.microsecond % 2]))


@settings(max_examples=60)
@given(st.sampled_from([("postgres", "timestamp"), ("postgres", "timestamptz"), ("mysql", "timestamp"),
                        ("mysql", "timestamptz")]).flatmap(
    lambda k: st.tuples(st.just(k), st.lists(st.one_of(st.none(), _ts_texts(k[0], k == ("postgres", "timestamptz"))),
                                             max_size=30))))
def test_vectorized_timestamps_equal_the_per_value_parser(case):
    (dialect, logical), texts = case
    arr, errors = column_from_text(logical, dialect, pa.array(texts, pa.string()))
    aware = dialect == "postgres" and logical == "timestamptz"
    parse = (lambda t: parse_pg_timestamp(t, aware)) if dialect == "postgres" else parse_mysql_datetime
    assert not errors
    assert from_arrow(logical, arr) == [None if t is None else parse(t) for t in texts]


@settings(max_examples=60)
@given(st.lists(st.one_of(st.none(), DAYS.map(lambda d: pg_date_text(date_from_days(d)))), max_size=30))
def test_vectorized_pg_dates_equal_the_per_value_parser(texts):
    arr, errors = column_from_text("date", "postgres", pa.array(texts, pa.string()))
    assert not errors and from_arrow("date", arr) == [None if t is None else parse_pg_date(t) for t in texts]


def test_vectorized_mysql_zero_dates_are_named_not_nulled_silently():
    arr, errors = column_from_text("timestamp", "mysql", pa.array(
        ["2024-01-01 00:00:00", "0000-00-00 00:00:00", None, "1582-10-10 12:00:00.5"]))
    assert list(errors) == [1] and isinstance(errors[1], ZeroDateError)
    assert from_arrow("timestamp", arr) == [dt.datetime(2024, 1, 1), None, None,
                                            dt.datetime(1582, 10, 10, 12, 0, 0, 500000)]


def test_numeric_text_and_keys():
    assert numeric_text(decimal.Decimal("1.50")) == "1.50"
    assert numeric_text(decimal.Decimal("1E-7")) == "0.0000001"
    assert numeric_text(decimal.Decimal("-0.00")) == "0.00"
    assert numeric_text(decimal.Decimal("NaN")) == "NaN" and numeric_text("-Infinity") == "-Infinity"
    assert numeric_key("1.50") == numeric_key("1.5") == "1.5" and numeric_key("-0.00") == "0"
    wide = "1234567890123456789012345678901234567890.000000000000000000000000001"
    assert numeric_key(wide) != numeric_key(wide[:-1] + "2")          # no 28-digit rounding
    assert encode_key(["1.50"], ["numeric"]) == encode_key(["1.5"], ["numeric(10,2)"])
    assert encode_key(["1.50"]) != encode_key(["1.5"])                 # plain text stays text


def test_float32_keys_have_one_text():
    assert float32(0.1) == 0.10000000149011612
    assert encode_key([0.1], ["float32"]) == encode_key([0.10000000149011612], ["float32"])
    assert encode_key([-0.0]) == encode_key([0.0])


def test_far_values_through_arrow():
    ts = [dt.datetime(2024, 1, 1), FarTimestamp(INT64_MAX), FarTimestamp(days_from_civil(-4712, 1, 1) * 86_400_000_000),
          None]
    for logical in ("timestamp", "timestamptz"):
        assert from_arrow(logical, to_arrow(logical, ts)) == ts
    dates = [dt.date(1, 1, 1), FarDate(INT32_MIN), FarDate(days_from_civil(5874897, 12, 31)), None]
    assert from_arrow("date", to_arrow("date", dates)) == dates


def test_copy_text_prints_what_postgresql_reads():
    t = pa.table({
        "ts": to_arrow("timestamptz", [dt.datetime(2024, 1, 1, 0, 0, 0, 5), FarTimestamp(INT64_MIN),
                                       FarTimestamp(days_from_civil(-43, 3, 15) * 86_400_000_000), None]),
        "d": to_arrow("date", [dt.date(1582, 10, 10), FarDate(INT32_MAX), FarDate(days_from_civil(0, 1, 1)), None]),
        "s": pa.array(["tab\there", "back\\slash", "new\nline\r", None]),
        "b": pa.array([b"\x00\xff", b"", None, b"\\"]),
        "f": pa.array([0.1, -0.0, float("nan"), float("-inf")], pa.float32()),
        "n": pa.array([decimal.Decimal("-1.50"), None, decimal.Decimal("0.00"), decimal.Decimal("1E+2")],
                      pa.decimal128(10, 2)),
    })
    lines = copy_text(t).decode().split("\n")
    assert lines[-1] == "" and len(lines) == 5
    assert lines[0].split("\t") == ["2024-01-01 00:00:00.000005+00", "1582-10-10", "tab\\there", "\\\\x00ff",
                                    "0.1", "-1.50"]
    assert lines[1].split("\t") == ["-infinity", "infinity", "back\\\\slash", "\\\\x", "-0", "\\N"]
    assert lines[2].split("\t") == ["0044-03-15 00:00:00.000000+00 BC", "0001-01-01 BC", "new\\nline\\r",
                                    "\\N", "nan", "0.00"]
    assert lines[3].split("\t") == ["\\N", "\\N", "\\N", "\\\\x5c", "-inf", "100.00"]


def test_copy_refuses_a_nul_character():
    with pytest.raises(UncarriedValueError, match="NUL character"):
        column_text(pa.array(["ok", "bad\x00"]), "note")


def test_one_text_form_for_every_session():
    assert "IntervalStyle=postgres" in pg_options() and "DateStyle=ISO,YMD" in pg_options()
    assert "SET extra_float_digits = '1'" in pg_set_statements()


def _digits(n: int):
    return st.text("0123456789", min_size=n, max_size=n)


_MYSQL_TEXTS = st.one_of(
    st.tuples(_digits(4), _digits(2), _digits(2)).map("-".join),
    st.builds(lambda d, t, f: f"{d} {t}{f}", st.tuples(_digits(4), _digits(2), _digits(2)).map("-".join),
              st.tuples(_digits(2), _digits(2), _digits(2)).map(":".join),
              st.one_of(st.just(""), st.integers(1, 7).flatmap(lambda n: _digits(n).map(lambda d: "." + d)))),
    st.text("0123456789-: .T+Z", max_size=28))


@settings(max_examples=2000)
@given(_MYSQL_TEXTS, st.booleans())
def test_the_fast_datetime_parse_is_the_exact_one(text, date_only):
    """parse_mysql_datetime's C fast path gives what the exact parser gives, or the same error."""
    from airflow_provider_dblog.engine.values import _parse_mysql_text

    def outcome(parse):
        try:
            return parse(text, date_only)
        except (ValueError, TypeError) as e:   # UncarriedValueError / ZeroDateError are ValueErrors
            return type(e)
    assert outcome(parse_mysql_datetime) == outcome(_parse_mysql_text)
