"""Values in PostgreSQL's text output format, parsed by type OID: what pgoutput sends
for every column (unless the subscriber asks for ``binary``).

``convert(type_oid, text)`` parses one value; ``converter_for(type_oid)`` looks the
parser up once, for a column's every value. Arrays of the scalar types are parsed
into (nested) lists (``parse_array``); an unknown OID keeps the text.

Text formats assumed (the session that runs the decoding decides them, so set them
on the replication connection): ``DateStyle=ISO`` (the default), any ``TimeZone``
(offsets are parsed), ``bytea_output=hex`` (the default); ``IntervalStyle`` is
irrelevant (interval is kept as text).
"""
from __future__ import annotations

import datetime as dt
import decimal
import re
from typing import Any, Callable, Optional

# type OIDs (pg_type.oid) of the built-in types parsed here
BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID, JSON = 16, 17, 19, 20, 21, 23, 25, 26, 114
FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1114, 1184, 1700, 2950, 3802

_TS_RE = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?$")
_DATE_RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?$")


def _bool(text: str) -> bool:
    if text in ("t", "true"):
        return True
    if text in ("f", "false"):
        return False
    raise ValueError(f"not a PostgreSQL bool: {text!r}")


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea value is not in hex format (set bytea_output = 'hex')")
    return bytes.fromhex(text[2:])


def _date(text: str) -> dt.date:
    if text == "infinity":
        return dt.date.max
    if text == "-infinity":
        return dt.date.min
    m = _DATE_RE.match(text)
    if not m or m.group(4):
        raise ValueError(f"date {text!r} is outside Python's range or not ISO (DateStyle)")
    return dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def _timestamp(text: str, aware: bool) -> dt.datetime:
    if text in ("infinity", "-infinity"):
        out = dt.datetime.max if text == "infinity" else dt.datetime.min
        return out.replace(tzinfo=dt.timezone.utc) if aware else out
    m = _TS_RE.match(text)
    if not m or m.group(12):
        raise ValueError(f"timestamp {text!r} is outside Python's range or not ISO (DateStyle)")
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    micros = int((m.group(7) or "0").ljust(6, "0"))
    value = dt.datetime(y, mo, d, h, mi, s, micros)
    if not aware:
        return value
    if not m.group(8):
        raise ValueError(f"timestamptz {text!r} has no UTC offset")
    off = dt.timedelta(hours=int(m.group(9)), minutes=int(m.group(10) or 0),
                       seconds=int(m.group(11) or 0))
    if m.group(8) == "-":
        off = -off
    # subtract the offset on the naive value, so no intermediate tz-aware range issue
    return (value - off).replace(tzinfo=dt.timezone.utc)


_SCALAR: dict[int, Callable[[str], Any]] = {
    BOOL: _bool,
    BYTEA: _bytea,
    INT2: int, INT4: int, INT8: int, OID: int,
    FLOAT4: float, FLOAT8: float,       # float() reads NaN / Infinity / -Infinity
    NUMERIC: decimal.Decimal,           # reads NaN / Infinity / -Infinity
    TEXT: str, VARCHAR: str, BPCHAR: str, NAME: str,
    DATE: _date,
    TIME: str,
    TIMESTAMP: lambda t: _timestamp(t, False),
    TIMESTAMPTZ: lambda t: _timestamp(t, True),
    JSON: str, JSONB: str,              # the engine stores JSON as text
    UUID: str,
}

#: array type OID -> element type OID (pg_type.typarray of the scalars above)
ARRAY_ELEMENT: dict[int, int] = {
    1000: BOOL, 1001: BYTEA, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT,
    1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR, 1015: VARCHAR,
    1182: DATE, 1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1231: NUMERIC, 2951: UUID,
    3807: JSONB,
}


def parse_array(text: str, element: Callable[[str], Any] = str) -> list:
    """Parse PostgreSQL's array text format (``{1,2,NULL}``, ``{"a b","c\\"d"}``,
    nested ``{{1,2},{3,4}}``, an optional ``[0:1]=`` bounds prefix) into (nested)
    lists; unquoted ``NULL`` is None, every other element goes through ``element``."""
    if text.startswith("["):
        eq = text.find("=")
        if eq < 0:
            raise ValueError(f"malformed array literal {text!r}")
        text = text[eq + 1:]
    pos = 0
    n = len(text)

    def fail(why: str):
        raise ValueError(f"malformed array literal {text!r}: {why} at {pos}")

    def parse_list() -> list:
        nonlocal pos
        if pos >= n or text[pos] != "{":
            fail("expected '{'")
        pos += 1
        out: list = []
        if pos < n and text[pos] == "}":
            pos += 1
            return out
        while True:
            if pos >= n:
                fail("unterminated")
            ch = text[pos]
            if ch == "{":
                out.append(parse_list())
            elif ch == '"':
                pos += 1
                buf = []
                while True:
                    if pos >= n:
                        fail("unterminated quoted element")
                    ch = text[pos]
                    if ch == "\\":
                        if pos + 1 >= n:
                            fail("dangling backslash")
                        buf.append(text[pos + 1])
                        pos += 2
                    elif ch == '"':
                        pos += 1
                        break
                    else:
                        buf.append(ch)
                        pos += 1
                out.append(element("".join(buf)))
            else:
                start = pos
                while pos < n and text[pos] not in ",}":
                    pos += 1
                raw = text[start:pos].strip()
                if raw == "":
                    fail("empty element")
                out.append(None if raw.upper() == "NULL" else element(raw))
            if pos >= n:
                fail("unterminated")
            if text[pos] == ",":
                pos += 1
            elif text[pos] == "}":
                pos += 1
                return out
            else:
                fail(f"unexpected {text[pos]!r}")

    result = parse_list()
    if pos != n:
        fail("trailing characters")
    return result


def _as_is(text: str) -> str:
    return text


def converter_for(type_oid: int) -> Callable[[str], Any]:
    """``convert`` for one type OID, looked up once (for a column's every value)."""
    fn = _SCALAR.get(type_oid)
    if fn is not None:
        return fn
    elem = ARRAY_ELEMENT.get(type_oid)
    if elem is not None:
        element = _SCALAR[elem]
        return lambda text: parse_array(text, element)
    return _as_is


def convert(type_oid: int, text: Optional[str]) -> Any:
    """A value in PostgreSQL's text output format, converted by its type OID.
    None stays None; an unknown OID returns the text as is."""
    return None if text is None else converter_for(type_oid)(text)
