"""Values carried exactly where Python's own types fall short, and the sources' text forms.

Python's ``date``/``datetime`` hold the years 1..9999 only. PostgreSQL also has BC
years, years past 9999 and ``±infinity``; those become :class:`FarDate` /
:class:`FarTimestamp`, which hold the value as Arrow does (days / microseconds since
1970-01-01 in the proleptic Gregorian calendar; ``±infinity`` at the ends of the
integer range, as PostgreSQL itself stores them). No Java calendar is involved
anywhere: dates and timestamps never cross JDBC as ``java.sql`` types (the sources
select them as text, and the apply stages them with ``COPY``).

Text parsers: one per source dialect, used by every path that reads text (the
PostgreSQL log, ``select_keys``, the Spark chunk select): ``arrow_values.column_from_text``
is the vectorized form of the per-value parsers and gives the same values (a
property test holds them equal). A value that cannot be carried exactly (a MySQL
zero date, a timestamp past Arrow's range) raises :class:`UncarriedValueError`.

Nothing here imports Airflow.
"""
from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from dataclasses import dataclass
from typing import Any


from .errors import UncarriedValueError, ZeroDateError

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = EPOCH.date()
US = dt.timedelta(microseconds=1)
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
INT32_MAX, INT32_MIN = (1 << 31) - 1, -(1 << 31)
DAYS_400Y = 146_097                       # a Gregorian cycle: the calendar repeats
_ORD_EPOCH = EPOCH_DATE.toordinal()       # proleptic ordinal of 1970-01-01
_PY_MIN_DAYS = dt.date.min.toordinal() - _ORD_EPOCH
_PY_MAX_DAYS = dt.date.max.toordinal() - _ORD_EPOCH


# -- values beyond Python's range ----------------------------------------------------
@dataclass(frozen=True, order=True)
class FarDate:
    """A date outside 0001..9999: ``days`` since 1970-01-01 (proleptic Gregorian);
    INT32_MAX / INT32_MIN are ``infinity`` / ``-infinity``."""
    days: int

    def isoformat(self) -> str:
        return pg_date_text(self)


@dataclass(frozen=True, order=True)
class FarTimestamp:
    """A timestamp outside 0001..9999: ``us`` since 1970-01-01 00:00 (proleptic
    Gregorian, UTC for a timestamptz); INT64_MAX / INT64_MIN are ``±infinity``."""
    us: int

    def isoformat(self, sep: str = " ") -> str:
        return pg_timestamp_text(self, False)


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day count since 1970-01-01; year 0 is 1 BC."""
    shift = 0
    while days < _PY_MIN_DAYS:
        days += DAYS_400Y
        shift -= 400
    while days > _PY_MAX_DAYS:
        days -= DAYS_400Y
        shift += 400
    d = dt.date.fromordinal(days + _ORD_EPOCH)
    return d.year + shift, d.month, d.day


def days_from_civil(year: int, month: int, day: int) -> int:
    """The inverse of civil_from_days (ValueError for a day that does not exist)."""
    shift = 0
    while year < 1:
        year += 400
        shift -= DAYS_400Y
    while year > 9999:
        year -= 400
        shift += DAYS_400Y
    return dt.date(year, month, day).toordinal() - _ORD_EPOCH + shift


def date_days(v: dt.date | FarDate) -> int:
    return v.days if isinstance(v, FarDate) else v.toordinal() - _ORD_EPOCH


def date_from_days(days: int) -> dt.date | FarDate:
    if _PY_MIN_DAYS <= days <= _PY_MAX_DAYS:
        return dt.date.fromordinal(days + _ORD_EPOCH)
    return FarDate(days)


def timestamp_us(v: dt.datetime | FarTimestamp) -> int:
    if isinstance(v, FarTimestamp):
        return v.us
    if v.tzinfo is not None:
        v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return (v - EPOCH) // US


def timestamp_from_us(us: int) -> dt.datetime | FarTimestamp:
    days, rest = divmod(us, 86_400_000_000)
    if _PY_MIN_DAYS <= days <= _PY_MAX_DAYS:
        return EPOCH + dt.timedelta(days=days, microseconds=rest)
    return FarTimestamp(us)


def _check_timestamp_range(us: int, text: str) -> int:
    if not INT64_MIN < us < INT64_MAX:
        raise UncarriedValueError(f"timestamp {text!r} is beyond the range of a 64-bit microsecond "
                                  "count (Arrow, Parquet, Spark)")
    return us


# -- PostgreSQL's text forms (DateStyle ISO, TimeZone UTC) ---------------------------
# Every PostgreSQL session of the engine prints and reads text with these settings: the
# dump's (psycopg2 and JDBC), the replication connection's (pgoutput prints with its
# walsender's settings) and the target's (COPY reads intervals by IntervalStyle), so a
# value has one text on every path whatever the server's or database's defaults.
PG_TEXT_SETTINGS = (("DateStyle", "ISO, YMD"), ("IntervalStyle", "postgres"), ("TimeZone", "UTC"),
                    ("extra_float_digits", "1"), ("bytea_output", "hex"),
                    ("standard_conforming_strings", "on"))


def pg_options() -> str:
    """PG_TEXT_SETTINGS as libpq ``options`` (``-c name=value ...``)."""
    return " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in PG_TEXT_SETTINGS)


def pg_set_statements() -> str:
    """PG_TEXT_SETTINGS as SET statements (a JDBC session's init statement)."""
    return "; ".join(f"SET {k} = '{v}'" for k, v in PG_TEXT_SETTINGS)


_PG_DATE = re.compile(r"^(\d{4,})-(\d\d)-(\d\d)( BC)?$")
_PG_TS = re.compile(r"^(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
                    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?$")


def _year(text: str, bc: str | None) -> int:
    return 1 - int(text) if bc else int(text)


def parse_pg_date(text: str) -> dt.date | FarDate:
    if text == "infinity":
        return FarDate(INT32_MAX)
    if text == "-infinity":
        return FarDate(INT32_MIN)
    m = _PG_DATE.match(text)
    if not m:
        raise ValueError(f"date {text!r} is not in PostgreSQL's ISO form (DateStyle ISO)")
    return date_from_days(days_from_civil(_year(m.group(1), m.group(4)), int(m.group(2)), int(m.group(3))))


def parse_pg_timestamp(text: str, aware: bool = False) -> dt.datetime | FarTimestamp:
    """A timestamp (``aware``: timestamptz, with its UTC offset) as naive (UTC) datetime."""
    if text == "infinity":
        return FarTimestamp(INT64_MAX)
    if text == "-infinity":
        return FarTimestamp(INT64_MIN)
    m = _PG_TS.match(text)
    if not m or bool(m.group(8)) != aware:
        raise ValueError(f"{'timestamptz' if aware else 'timestamp'} {text!r} is not in "
                         "PostgreSQL's ISO form (DateStyle ISO)")
    days = days_from_civil(_year(m.group(1), m.group(12)), int(m.group(2)), int(m.group(3)))
    secs = int(m.group(4)) * 3600 + int(m.group(5)) * 60 + int(m.group(6))
    if aware:
        off = int(m.group(9)) * 3600 + int(m.group(10) or 0) * 60 + int(m.group(11) or 0)
        secs -= off if m.group(8) == "+" else -off
    us = (days * 86_400 + secs) * 1_000_000 + int((m.group(7) or "0").ljust(6, "0"))
    return timestamp_from_us(_check_timestamp_range(us, text))


def pg_date_text(v: dt.date | FarDate) -> str:
    """A date as PostgreSQL reads it back exactly (BC years, infinity)."""
    days = date_days(v)
    if days == INT32_MAX:
        return "infinity"
    if days == INT32_MIN:
        return "-infinity"
    y, m, d = civil_from_days(days)
    return f"{y:04d}-{m:02d}-{d:02d}" if y > 0 else f"{1 - y:04d}-{m:02d}-{d:02d} BC"


def pg_timestamp_text(v: dt.datetime | FarTimestamp, aware: bool) -> str:
    """A timestamp as PostgreSQL reads it back exactly (``aware``: with ``+00``)."""
    us = timestamp_us(v)
    if us == INT64_MAX:
        return "infinity"
    if us == INT64_MIN:
        return "-infinity"
    days, rest = divmod(us, 86_400_000_000)
    y, mo, d = civil_from_days(days)
    secs, frac = divmod(rest, 1_000_000)
    text = (f"{abs(y) if y > 0 else 1 - y:04d}-{mo:02d}-{d:02d} "
            f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}.{frac:06d}")
    return text + ("+00" if aware else "") + (" BC" if y <= 0 else "")


# -- MySQL's text forms (CAST(... AS CHAR) in a UTC session) -------------------------
_MY_TS = re.compile(r"^(\d{4})-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?$")


def parse_mysql_datetime(text: str, date_only: bool = False) -> dt.datetime | dt.date:
    """A MySQL DATE / DATETIME / TIMESTAMP text. A zero date ('0000-00-00'), a date with
    a zero part or a day that does not exist (ALLOW_INVALID_DATES) has no exact
    counterpart in any target: UncarriedValueError."""
    # the common text, in the exact shape MySQL prints, by the C parser (a tenth of the
    # time: the tail parses every DATETIME); anything else, zero dates too, below
    n = len(text)
    if n == 10 and date_only and text[4] == text[7] == "-":
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            pass
    elif (not date_only and n >= 19 and text[4] == text[7] == "-" and text[10] == " " and text[13] == text[16] == ":"
          and (n == 19 or (21 <= n <= 26 and text[19] == "." and text[20:].isdigit()))):
        try:
            return dt.datetime.fromisoformat(text)
        except ValueError:
            pass
    return _parse_mysql_text(text, date_only)


def _parse_mysql_text(text: str, date_only: bool) -> dt.datetime | dt.date:
    m = _MY_TS.match(text)
    if not m or (date_only and m.group(4)):
        raise ValueError(f"{text!r} is not a MySQL date/datetime")
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if y == 0 or mo == 0 or d == 0:
        raise ZeroDateError(f"zero date {text!r} has no exact counterpart (a date with a zero "
                                  "year, month or day); fix the value at the source, or set the "
                                  "source's zero_dates: null to carry zero dates as NULL")
    try:
        day = dt.date(y, mo, d)
    except ValueError:
        raise UncarriedValueError(f"invalid date {text!r} (ALLOW_INVALID_DATES) has no exact "
                                  "counterpart") from None
    if date_only:
        return day
    micros = int((m.group(7) or "0").ljust(6, "0"))
    return dt.datetime(y, mo, d, int(m.group(4) or 0), int(m.group(5) or 0), int(m.group(6) or 0), micros)


def mysql_datetime_text(v: dt.datetime | dt.date) -> str:
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ", timespec="microseconds")
    return v.isoformat()


# -- numbers -------------------------------------------------------------------------
_F32 = struct.Struct("<f")


def float32(v: float) -> float:
    """A double rounded to the nearest float32 (what a REAL/FLOAT column holds), so the
    same stored value has one Python value on every path."""
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:
        raise ValueError(f"{v!r} is out of range for a 4-byte float") from None


NUMERIC_TEXT = re.compile(r"^-?\d+(\.\d+)?$|^(NaN|-?Infinity)$")


def numeric_text(value: decimal.Decimal | int | str) -> str:
    """A numeric value as the text the event log carries: plain digits with the
    value's own scale ('1.50' stays '1.50'), 'NaN', 'Infinity', '-Infinity'."""
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value).strip())
    if d.is_nan():
        return "NaN"
    if d.is_infinite():
        return "-Infinity" if d < 0 else "Infinity"
    if d.is_zero():
        d = abs(d)
    return format(d, "f")


def numeric_key(text: str) -> str:
    """One text per numeric value, whatever its scale ('1.50' and '1.5' agree)."""
    d = decimal.Decimal(text)
    if not d.is_finite():
        return numeric_text(d)
    d = d.normalize(decimal.Context(prec=max(len(d.as_tuple().digits), 1)))
    return "0" if d.is_zero() else format(d, "f")


# -- comparing values read on two sides ---------------------------------------------------
_HMS = re.compile(r"^(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")


def _interval_us(text: str) -> Any:
    """'[-]H:MM:SS[.f]' (MySQL TIME, and PostgreSQL's text of such an interval) in
    microseconds; any other interval text stays text (PostgreSQL on both sides)."""
    m = _HMS.match(text)
    if not m:
        return text
    us = ((int(m.group(2)) * 60 + int(m.group(3))) * 60 + int(m.group(4))) * 1_000_000 \
        + int((m.group(5) or "0").ljust(6, "0"))
    return -us if m.group(1) else us


def comparable(logical: str, v: Any) -> Any:
    """One exact form of a value of a logical type, whichever side read it: the source
    (its own text, e.g. MySQL TIME '-01:00:00.500') or a PostgreSQL target (the column's
    type, e.g. interval '-01:00:00.5'). Equal exactly when the values are equal."""
    if v is None:
        return None
    if isinstance(v, memoryview | bytearray):
        return bytes(v)
    if logical.startswith("decimal("):
        d = decimal.Decimal(v)
        return format(d.normalize(decimal.Context(prec=max(len(d.as_tuple().digits), 1))), "f")
    if logical == "float32":
        return repr(float32(float(v)))
    if logical == "float64":
        return repr(float(v))
    if logical == "text:interval":
        return _interval_us(v)
    if logical in ("date", "timestamp", "timestamptz"):
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return v.isoformat()
    return v


# PostgreSQL's interval text with IntervalStyle postgres (PG_TEXT_SETTINGS): fields each
# with its own sign, e.g. '-1 years +2 mons 3 days -04:05:06.5'
_PG_INTERVAL = re.compile(r"^(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
                          r"(?:([+-])?(\d+):([0-5]\d):([0-5]\d)(?:\.(\d{1,6}))?)?$")
_DAY_US = 86_400_000_000


def interval_key_us(text: str) -> Any:
    """An interval's text (MySQL TIME '-01:00:00.5'; PostgreSQL's, '1 mon 2 days 03:00:00')
    as the microseconds PostgreSQL orders and compares intervals by (interval_cmp: a month
    is 30 days, a day 24 hours, so '1 day' = '24:00:00' and '1 mon' = '30 days'): equal
    exactly when the database takes the keys for one. Any other text stays itself."""
    m = _PG_INTERVAL.match(text)
    if not text or not m:
        return text
    years, months, days, sign, h, mi, sec, frac = m.groups()
    span = ((int(years or 0) * 12 + int(months or 0)) * 30 + int(days or 0)) * _DAY_US
    if h is not None:
        us = ((int(h) * 60 + int(mi)) * 60 + int(sec)) * 1_000_000 + int((frac or "0").ljust(6, "0"))
        span += -us if sign == "-" else us
    return span


def comparable_key(logical: str, v: Any) -> Any:
    """comparable, for a key: the values the database takes for one key are one (a
    numeric's scale does not count, 1.5 and 1.50; nor an interval's spelling)."""
    if v is not None and logical.startswith("numeric"):
        return numeric_key(str(v))
    if v is not None and logical.startswith("text:interval"):   # (interval(3), interval day to second)
        return interval_key_us(str(v))
    return comparable(logical, v)
