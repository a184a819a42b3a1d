"""Values from the binlog (mysql-replication) and from pymysql as the column's
logical Python type (``to_logical``), so that a log event and a chunk row of the
same row are equal; and key values as SQL values that compare in the column's own
order (``key_sql_value``)."""
from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
from typing import Any, Callable

from ...errors import UncarriedValueError, ZeroDateError
from ...values import EPOCH, float32, numeric_text, parse_mysql_datetime
from .types import INT_BITS, NativeColumn

# logical type -> the Python type its values already have when nothing is to be done
PLAIN_TYPES = {"string": str, "json": str, "binary": bytes, "float64": float}
# data types with their own conversions (never kept as they come)
SPECIAL_TYPES = {"time", "set", "binary", "bit", "year", "float", "date", "datetime", "timestamp"}
INT_LIMIT = {t: 1 << (b - 1) for t, b in INT_BITS.items()}
_ZERO_SOURCES = {"out of date range", "out of datetime range", "out of datetime2 range"}
_ZERO_FIX = "fix the value at the source, or set the source's zero_dates: null"


def format_time(value: dt.timedelta, fsp: int) -> str:
    """A TIME value as MySQL prints it (``-838:59:59.000000`` .. ``838:59:59``)."""
    us = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if us < 0 else ""
    us = abs(us)
    secs, frac = divmod(us, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    text = f"{sign}{h:02d}:{m:02d}:{s:02d}"
    if fsp > 0:
        text += "." + f"{frac:06d}"[:fsp]
    return text


def fix_negative_time2(value: dt.timedelta) -> dt.timedelta:
    """mysql-replication 1.0.17 decodes a negative TIME(fsp>0) with a fraction as
    -(int + (1 - frac)) instead of -(int + frac); undo that."""
    us = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    if us >= 0:
        return value
    whole, frac = divmod(-us, 1_000_000)
    if frac == 0:
        return value
    return -dt.timedelta(seconds=whole, microseconds=1_000_000 - frac)


def to_logical(n: NativeColumn, value: Any, none_source: str | None = None) -> Any:
    """A value from the binlog or from pymysql as the column's logical Python type.

    ``none_source``: why the binlog reader gave None (mysql-replication's none_sources):
    a zero or invalid date comes as None with an "out of ... range" source.
    Strict: a value of an unexpected Python type raises TypeError/ValueError (the
    table changed under us); a value no target can hold raises UncarriedValueError."""
    if value is None:
        if none_source in _ZERO_SOURCES and not n.zero_as_null:
            raise ZeroDateError(f"a zero or invalid {n.data_type.upper()} ({none_source} in the "
                                f"binlog) has no exact counterpart; {_ZERO_FIX}")
        return None
    t = n.logical
    # the common case first (the tail converts every value of every row): a value that
    # already has its logical type's exact Python type
    kind = type(value)
    if kind is PLAIN_TYPES.get(t) and n.data_type not in SPECIAL_TYPES:
        return value
    if kind is int and t in INT_BITS and n.data_type not in SPECIAL_TYPES:
        if -INT_LIMIT[t] <= value < INT_LIMIT[t]:
            return value
        raise ValueError(f"{value} is out of range for {t}")
    # data types whose logical type is an integer of another meaning
    if n.data_type == "year":
        return _year(n, value)
    if n.data_type == "bit" and t != "bool":
        return _bit_number(n, value)
    convert = _converter(t)
    if convert is None:
        raise TypeError(f"unsupported logical type {t}")
    return convert(n, value)


def _expect(value: Any, types: type | tuple[type, ...], what: str) -> None:
    """TypeError unless ``value`` is of ``types`` (a bool is never a number)."""
    if isinstance(value, bool) or not isinstance(value, types):
        raise TypeError(f"expected {what}, got {type(value).__name__}")


def _year(n: NativeColumn, value: Any) -> int:
    _expect(value, int, "a year")
    return 0 if value == 1900 else value   # the binlog reader adds 1900 to YEAR 0's 0 byte


def _bit_number(n: NativeColumn, value: Any) -> int | decimal.Decimal:
    if isinstance(value, str):                          # binlog: "0101..."
        value = int(value, 2)
    elif isinstance(value, (bytes, bytearray)):         # pymysql
        value = int.from_bytes(value, "big")
    _expect(value, int, "an integer")
    return decimal.Decimal(value) if n.logical.startswith("decimal(") else value


def _integer(n: NativeColumn, value: Any) -> int:
    _expect(value, int, "an integer")
    t = n.logical
    if not -INT_LIMIT[t] <= value < INT_LIMIT[t]:
        raise ValueError(f"{value} is out of range for {t}")
    return value


def _decimal(n: NativeColumn, value: Any) -> decimal.Decimal:
    _expect(value, (int, decimal.Decimal), "a decimal")
    return decimal.Decimal(value)


def _numeric(n: NativeColumn, value: Any) -> str:
    _expect(value, (int, decimal.Decimal, str), "a decimal")
    return numeric_text(value)


def _bool(n: NativeColumn, value: Any) -> bool:
    if isinstance(value, str):          # binlog BIT(1): "1"/"0"
        return value == "1"
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(value, "big") != 0
    if isinstance(value, int):
        return bool(value)
    raise TypeError(f"expected a bit, got {type(value).__name__}")


def _float(n: NativeColumn, value: Any) -> float:
    _expect(value, (int, float, decimal.Decimal), "a number")
    return float32(float(value)) if n.logical == "float32" else float(value)


def _text(n: NativeColumn, value: Any) -> str:
    if n.data_type == "time":
        if isinstance(value, dt.timedelta):
            return format_time(value, n.fsp)
    elif n.data_type == "set" and isinstance(value, (set, frozenset)):
        bits = {getattr(v, "bit", None) for v in value}   # logged_labels.SetMember: a member twice is two
        if n.set_values and None not in bits:
            return ",".join(m for i, m in enumerate(n.set_values) if i in bits)
        order = n.set_values or tuple(sorted(value))
        return ",".join(v for v in order if v in value)
    if isinstance(value, (bytes, bytearray)):  # text handed over as its bytes (rows.raw_text)
        return decode_text(n, value)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def decode_text(n: NativeColumn, value: bytes | bytearray) -> str:
    """Text bytes as the server reads them (NativeColumn.encoding); UncarriedValueError for
    bytes the column's codec has no character for (the event is held, not the tail)."""
    try:
        return bytes(value).decode(n.encoding)
    except UnicodeDecodeError as e:
        fix = "" if n.encoding == "utf-8" else "convert the column to utf8mb4, or "
        raise UncarriedValueError(
            f"the {n.charset or 'utf8'} value 0x{bytes(value).hex()} has no character for byte "
            f"0x{bytes(value)[e.start]:02x} (at {e.start}) in Python's {n.encoding} codec; {fix}"
            "fix the value at the source") from None


def _json(n: NativeColumn, value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return decode_text(n, value)
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, int, float, bool)):  # MySQL 8 binary JSON
        return json.dumps(_json_text(value), ensure_ascii=False)
    raise TypeError(f"expected JSON text, got {type(value).__name__}")


def _json_text(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, dict):
        return {_json_text(k): _json_text(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_text(x) for x in v]
    return v


def _binary(n: NativeColumn, value: Any) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    value = bytes(value)
    if n.data_type == "binary" and n.length and len(value) < n.length:
        value = value.ljust(n.length, b"\x00")  # the binlog strips BINARY(n) padding
    return value


def _date(n: NativeColumn, value: Any) -> dt.date | None:
    if isinstance(value, str):          # selected as text (select_expr)
        return _parsed_date(n, value, date_only=True)
    if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
        raise TypeError(f"expected a date, got {type(value).__name__}")
    return value


def _datetime(n: NativeColumn, value: Any) -> dt.datetime | None:
    if isinstance(value, str):          # selected as text (select_expr)
        return _parsed_date(n, value)
    if not isinstance(value, dt.datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if n.logical == "timestamptz" and value == EPOCH:
        # the binlog carries TIMESTAMP as seconds since the epoch, and 0 is the zero
        # TIMESTAMP: 1970-01-01 00:00:00 UTC itself is outside TIMESTAMP's range
        if not n.zero_as_null:
            raise ZeroDateError("the zero TIMESTAMP ('0000-00-00 00:00:00') has no exact "
                                f"counterpart; {_ZERO_FIX}")
        return None
    return value


def _parsed_date(n: NativeColumn, text: str, **kw) -> Any:
    """MySQL's text of a date; a zero date is None where the source says zero_dates: null."""
    try:
        return parse_mysql_datetime(text, **kw)
    except ZeroDateError:
        if n.zero_as_null:
            return None
        raise


@functools.cache
def _converter(logical: str) -> Callable[[NativeColumn, Any], Any] | None:
    """The conversion of values into a logical type; None if there is none."""
    if logical in INT_BITS:
        return _integer
    for prefix, convert in (("decimal(", _decimal), ("numeric", _numeric), ("text:", _text)):
        if logical.startswith(prefix):
            return convert
    return {"bool": _bool, "float32": _float, "float64": _float, "string": _text, "json": _json,
            "binary": _binary, "date": _date, "timestamp": _datetime,
            "timestamptz": _datetime}.get(logical)


def key_sql_value(n: NativeColumn, value: Any, exact: bool = True) -> Any:
    """A key value as the SQL value that compares with the column in its own order:
    ENUM and SET by their numbers (ORDER BY sorts them so, a string compares as text),
    numeric text as a Decimal (a string would compare as a double).

    A label the column does not have: ValueError when ``exact`` (a chunk bound must be a
    real key: any stand-in would move the range), else -1, which no row holds (a key a
    user typed is then simply not there)."""
    if n.data_type in ("enum", "set") and isinstance(value, str):
        number = _label_number(n, value)
        if number is None:
            if exact:
                raise ValueError(f"{value!r} is not a value of {n.name} {n.column_type} (its labels: "
                                 f"{list(n.set_values)}); the column changed: refresh the table's schema")
            return -1
        return number
    if n.logical.startswith("numeric") and isinstance(value, str):
        return decimal.Decimal(value)
    return value


def _label_number(n: NativeColumn, value: str) -> int | None:
    """The number MariaDB stores for an ENUM label (its index, '' of a bad value 0) or a SET
    value (its members' bits); None if the column has no such label."""
    if n.data_type == "enum":
        if value in n.set_values:   # a label twice: two the catalog printed alike ('?' for one outside the BMP)
            return n.set_values.index(value) + 1 if n.set_values.count(value) == 1 else None
        return 0 if value == "" else None
    members = value.split(",") if value else []
    if any(n.set_values.count(m) != 1 for m in members):
        return None
    return sum(1 << i for i, m in enumerate(n.set_values) if m in members)
