"""MySQL / MariaDB source: information_schema shapes, watermarks, key-range chunk
planning, bound-parameter key lookups and a binlog reader (mysql-replication).

Positions are (binlog file number, start offset of the rows event, row index in
the event). A TxnEnd sits at the offset of the event after the commit, so it is
greater than every event of its transaction and not greater than any later one.

Values from the binlog and from SELECTs are converted by one function
(``to_logical``) into the table's logical types, so a log event and a chunk row
of the same row are equal. A few native types are selected through an SQL
expression (``select_expr``) so that SELECT, Spark JDBC and the binlog agree:
TIME, DATE, DATETIME, TIMESTAMP and DECIMAL(p>38) as their text (parsed by
engine/values.py: no Java calendar, zero dates caught), FLOAT as the exact DOUBLE,
YEAR and BIT(n>1) as integers.

Nothing here imports Airflow.
"""
from __future__ import annotations

import codecs
import datetime as dt
import decimal
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pymysql
from pymysql.constants import CLIENT

from ..errors import (DBLogError, NoPrimaryKeyError, SchemaChangedError, SourceSetupError,
                      UncarriedValueError, UnknownTableError, WatermarkError, ZeroDateError)
from ..events import DELETE, INSERT, UPDATE, Event
from ..positions import Position
from ..schema import Column, TableSchema
from ..values import EPOCH, float32, numeric_text, parse_mysql_datetime
from .base import ChunkPlan, Idle, LogItem, Problem, RowChange, TxnEnd, WatermarkSeen
from .common import SELECT_BATCH, WATERMARK_TABLE, SqlSource, raw_key_alias

log = logging.getLogger(__name__)

JDBC_DRIVER = "org.mariadb.jdbc.Driver"
# the session the JDBC reader gets: no NO_BACKSLASH_ESCAPES (range_predicates
# escapes backslashes), ANSI_QUOTES in case a dialect quotes with ", and UTC so
# TIMESTAMP columns read as the binlog decodes them
JDBC_SQL_MODE = "ANSI_QUOTES,STRICT_TRANS_TABLES"
SESSION_TIME_ZONE = "+00:00"


# -- identifiers and literals ---------------------------------------------------
def quote_ident(name: str) -> str:
    """A MySQL identifier in backticks (embedded backticks doubled)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"bad identifier {name!r}")
    return "`" + name.replace("`", "``") + "`"


def quote_table(qualified: str) -> str:
    db, _, table = qualified.partition(".")
    return f"{quote_ident(db)}.{quote_ident(table)}"


def sql_literal(value: Any) -> str:
    """A key value (read from the database itself) as a MySQL literal.

    Only for values that came from the source (chunk bounds), never for user
    input, and only valid in a session without NO_BACKSLASH_ESCAPES (the JDBC
    session sets its sql_mode, see MySQLSource.jdbc)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"cannot render non-finite float {value!r}")
        return repr(value)   # the shortest text that reads back as the same double
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"cannot render non-finite decimal {value!r}")
        return format(value, "f")
    if isinstance(value, str):
        escaped = (value.replace("\\", "\\\\").replace("'", "''")
                   .replace("\x00", "\\0").replace("\x1a", "\\Z"))
        return f"'{escaped}'"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            raise ValueError(f"cannot render timezone-aware datetime {value!r}")
        return "'" + value.isoformat(sep=" ", timespec="microseconds") + "'"
    if isinstance(value, dt.date):
        return "'" + value.isoformat() + "'"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "X'" + bytes(value).hex() + "'"
    raise TypeError(f"cannot render a {type(value).__name__} key value as SQL: {value!r}")


def _key_after(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any], str]) -> str:
    """``(cols) > (vals)`` expanded so that MariaDB's range optimiser uses the key."""
    # (lit binds in call order, so build the text strictly left to right)
    q = [quote_ident(c) for c in cols]
    if len(q) == 1:
        return f"{q[0]} > {lit(vals[0])}"
    prefix = f"{q[0]} >= {lit(vals[0])}"
    ors = []
    for i in range(len(q)):
        parts = [f"{q[j]} = {lit(vals[j])}" for j in range(i)] + [f"{q[i]} > {lit(vals[i])}"]
        ors.append("(" + " AND ".join(parts) + ")")
    return f"({prefix} AND ({' OR '.join(ors)}))"


def _key_upto(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any], str]) -> str:
    """``(cols) <= (vals)`` expanded."""
    q = [quote_ident(c) for c in cols]
    if len(q) == 1:
        return f"{q[0]} <= {lit(vals[0])}"
    prefix = f"{q[0]} <= {lit(vals[0])}"
    ors = []
    for i in range(len(q)):
        parts = [f"{q[j]} = {lit(vals[j])}" for j in range(i)] + [f"{q[i]} < {lit(vals[i])}"]
        ors.append("(" + " AND ".join(parts) + ")")
    ors.append("(" + " AND ".join(f"{q[j]} = {lit(vals[j])}" for j in range(len(q))) + ")")
    return f"({prefix} AND ({' OR '.join(ors)}))"


class _Params:
    """A literal renderer that binds: each value becomes %s and joins ``args``."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.args.append(value)
        return "%s"


# -- native types -> logical types ---------------------------------------------
_INTS = {"tinyint": ("int8", "int16"), "smallint": ("int16", "int32"),
         "mediumint": ("int32", "int32"), "int": ("int32", "int64"),
         "integer": ("int32", "int64"), "bigint": ("int64", "decimal(20,0)")}
_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set",
            "nchar", "nvarchar"}
_BINARIES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry",
             "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
             "geometrycollection", "geomcollection"}
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
# MySQL character sets whose Python codec has another name
_CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252",
           "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le",
           "utf32": "utf-32-be", "binary": "latin-1", "koi8r": "koi8-r", "koi8u": "koi8-u",
           "sjis": "shift_jis", "ujis": "euc_jp", "eucjpms": "euc_jp", "euckr": "euc_kr",
           "gb2312": "gb2312", "gbk": "gbk", "big5": "big5", "cp932": "cp932", "greek": "iso8859-7",
           "hebrew": "iso8859-8", "latin2": "iso8859-2", "latin5": "iso8859-9",
           "latin7": "iso8859-13", "tis620": "cp874", "macroman": "mac-roman"}
# decoded wrongly by mysql-replication 1.0.17 (as little-endian): refused
_BAD_CHARSETS = {"utf16", "utf32"}


def _check_charset(charset: str) -> None:
    if not charset or charset == "binary":
        return
    if charset in _BAD_CHARSETS:
        raise ValueError(f"character set {charset} is not supported (the binlog reader decodes "
                         "it wrongly); convert the column to utf8mb4")
    try:
        codecs.lookup(_CODECS.get(charset, charset))
    except LookupError:
        raise ValueError(f"character set {charset} has no Python codec; convert the column "
                         "to utf8mb4") from None


@dataclass(frozen=True)
class NativeColumn:
    """What the logical type alone does not say, needed to convert values."""
    name: str
    data_type: str       # information_schema DATA_TYPE, lower case
    column_type: str     # information_schema COLUMN_TYPE, lower case
    logical: str
    fsp: int = 0         # TIME fractional digits
    length: int = 0      # BINARY(n) octets, BIT(n) bits
    set_values: tuple[str, ...] = ()   # ENUM / SET members in declaration order
    charset: str = ""    # CHARACTER_SET_NAME of text columns
    zero_as_null: bool = False   # the source's zero_dates: null (a zero date becomes NULL)

    @property
    def encoding(self) -> str:
        """The Python codec of the column's character set (for raw binlog bytes)."""
        return _CODECS.get(self.charset, self.charset or "utf-8")


def logical_type(data_type: str, column_type: str, precision: int | None, scale: int | None,
                 is_json: bool = False) -> str:
    """The logical type (engine/schema.py) of a MySQL column; ValueError if unsupported."""
    dt_ = data_type.lower()
    unsigned = "unsigned" in column_type.lower()
    if dt_ in _INTS:
        return _INTS[dt_][1 if unsigned else 0]
    if dt_ in ("decimal", "numeric", "dec", "fixed"):
        p, s = int(precision or 10), int(scale or 0)
        # past 38 digits (Arrow decimal128, Spark): the exact text, typed numeric(p,s)
        return f"decimal({p},{s})" if p <= 38 else f"numeric({p},{s})"
    if dt_ == "float":
        return "float32"
    if dt_ in ("double", "real", "double precision"):
        return "float64"
    if dt_ == "bit":
        m = re.search(r"\((\d+)\)", column_type)
        bits = int(m.group(1)) if m else 1
        return "bool" if bits == 1 else "int64" if bits < 64 else "decimal(20,0)"
    if dt_ == "json" or (is_json and dt_ in ("longtext", "text", "mediumtext")):
        return "json"
    if dt_ in _STRINGS:
        return "string"
    if dt_ in _BINARIES:
        return "binary"
    if dt_ == "date":
        return "date"
    if dt_ == "datetime":
        return "timestamp"
    if dt_ == "timestamp":   # an instant, stored in UTC
        return "timestamptz"
    if dt_ == "time":        # a duration (-838:59:59 .. 838:59:59), not a time of day
        return "text:interval"
    if dt_ == "year":
        return "int16"
    raise ValueError(f"column type {column_type!r} is not supported")


def _set_members(column_type: str) -> tuple[str, ...]:
    """The members of an ENUM(...) or SET(...) column type, in declaration order."""
    m = re.match(r"^\s*(?:set|enum)\s*\((.*)\)\s*$", column_type, re.S | re.I)
    if not m:
        return ()
    return tuple(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", m.group(1)))


def select_expr(n: NativeColumn) -> str:
    """The SELECT expression giving a column's value in the form the binlog decodes.

    CHAR/ENUM/SET become VARCHAR: Spark (readSideCharPadding) pads CHAR(n)
    columns read over JDBC to n characters, and the driver reports ENUM and SET
    as CHAR."""
    q = quote_ident(n.name)
    if n.data_type in _TEXT_READ or n.logical.startswith("numeric"):
        return f"CAST({q} AS CHAR) AS {q}"
    if n.data_type == "float":
        return f"CAST({q} AS DOUBLE) AS {q}"
    if n.data_type == "bit" and n.length == 64:
        return f"CAST({q} AS UNSIGNED) AS {q}"
    if n.data_type == "year" or (n.data_type == "bit" and n.length > 1):
        return f"CAST({q} AS SIGNED) AS {q}"
    return q


# read as their text: TIME is carried as text; dates through engine/values.py (no JDBC
# date types, so no Java calendar; zero dates are seen)
_TEXT_READ = {"time", "char", "nchar", "enum", "set", "date", "datetime", "timestamp"}


def text_parsed(n: NativeColumn) -> bool:
    """Selected as text that engine/values.py parses into the logical type."""
    return n.data_type in ("date", "datetime", "timestamp") or n.logical.startswith("numeric")


def _needs_expr(n: NativeColumn) -> bool:
    return select_expr(n) != quote_ident(n.name)


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


def _fix_negative_time2(value: dt.timedelta) -> dt.timedelta:
    """mysql-replication 1.0.17 decodes a negative TIME(fsp>0) with a fraction as
    -(int + (1 - frac)) instead of -(int + frac); undo that."""
    us = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    if us >= 0:
        return value
    whole, frac = divmod(-us, 1_000_000)
    if frac == 0:
        return value
    return -dt.timedelta(seconds=whole, microseconds=1_000_000 - frac)


# logical type -> the Python type its values already have when nothing is to be done
_PLAIN = {"string": str, "json": str, "binary": bytes, "float64": float}
# data types with their own conversions (never kept as they come)
_SPECIAL = {"time", "set", "binary", "bit", "year", "float", "date", "datetime", "timestamp"}
_INT_LIMIT = {t: 1 << (b - 1) for t, b in _INT_BITS.items()}
_ZERO_SOURCES = {"out of date range", "out of datetime range", "out of datetime2 range"}


def to_logical(n: NativeColumn, value: Any, none_source: str | None = None) -> Any:
    """A value from the binlog or from pymysql as the column's logical Python type.

    ``none_source``: why the binlog reader gave None (mysql-replication's none_sources):
    a zero or invalid date comes as None with an "out of ... range" source.
    Strict: a value of an unexpected Python type raises TypeError/ValueError (the
    table changed under us); a value no target can hold raises UncarriedValueError."""
    if value is None:
        if none_source in _ZERO_SOURCES and not n.zero_as_null:
            raise ZeroDateError(f"a zero or invalid {n.data_type.upper()} ({none_source} in the "
                                "binlog) has no exact counterpart; fix the value at the source, "
                                "or set the source's zero_dates: null")
        return None
    t = n.logical
    # the common case first (the tail converts every value of every row): a value that
    # already has its logical type's exact Python type
    kind = type(value)
    if kind is _PLAIN.get(t) and n.data_type not in _SPECIAL:
        return value
    if kind is int and t in _INT_BITS and n.data_type not in _SPECIAL:
        if -_INT_LIMIT[t] <= value < _INT_LIMIT[t]:
            return value
        raise ValueError(f"{value} is out of range for {t}")
    if n.data_type == "year":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected a year, got {type(value).__name__}")
        return 0 if value == 1900 else value   # the binlog reader adds 1900 to YEAR 0's 0 byte
    if n.data_type == "bit" and t != "bool":
        if isinstance(value, str):                          # binlog: "0101..."
            value = int(value, 2)
        elif isinstance(value, (bytes, bytearray)):         # pymysql
            value = int.from_bytes(value, "big")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return decimal.Decimal(value) if t.startswith("decimal(") else value
    if t in _INT_BITS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        if not -_INT_LIMIT[t] <= value < _INT_LIMIT[t]:
            raise ValueError(f"{value} is out of range for {t}")
        return value
    if t.startswith("decimal("):
        if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
            raise TypeError(f"expected a decimal, got {type(value).__name__}")
        return decimal.Decimal(value)
    if t.startswith("numeric"):
        if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal, str)):
            raise TypeError(f"expected a decimal, got {type(value).__name__}")
        return numeric_text(value)
    if t == "bool":
        if isinstance(value, str):          # binlog BIT(1): "1"/"0"
            return value == "1"
        if isinstance(value, (bytes, bytearray)):
            return int.from_bytes(value, "big") != 0
        if isinstance(value, int):
            return bool(value)
        raise TypeError(f"expected a bit, got {type(value).__name__}")
    if t in ("float32", "float64"):
        if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float32(float(value)) if t == "float32" else float(value)
    if t == "string" or t.startswith("text:"):
        if n.data_type == "time":
            if isinstance(value, dt.timedelta):
                return format_time(value, n.fsp)
        elif n.data_type == "set" and isinstance(value, (set, frozenset)):
            order = n.set_values or tuple(sorted(value))
            return ",".join(v for v in order if v in value)
        if isinstance(value, (bytes, bytearray)):  # a character set the library cannot decode
            return bytes(value).decode(n.encoding)
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value
    if t == "json":
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode(n.encoding)
        if isinstance(value, str):
            return value
        if isinstance(value, (dict, list, int, float, bool)):  # MySQL 8 binary JSON
            return json.dumps(_json_text(value), ensure_ascii=False)
        raise TypeError(f"expected JSON text, got {type(value).__name__}")
    if t == "binary":
        if isinstance(value, str):
            value = value.encode("utf-8")
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"expected bytes, got {type(value).__name__}")
        value = bytes(value)
        if n.data_type == "binary" and n.length and len(value) < n.length:
            value = value.ljust(n.length, b"\x00")  # the binlog strips BINARY(n) padding
        return value
    if t == "date":
        if isinstance(value, str):          # selected as text (select_expr)
            return _zero_as(n, parse_mysql_datetime, value, date_only=True)
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
            raise TypeError(f"expected a date, got {type(value).__name__}")
        return value
    if t in ("timestamp", "timestamptz"):
        if isinstance(value, str):          # selected as text (select_expr)
            return _zero_as(n, parse_mysql_datetime, value)
        if not isinstance(value, dt.datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        if t == "timestamptz" and value == EPOCH and not n.zero_as_null:
            # the binlog carries TIMESTAMP as seconds since the epoch, and 0 is the zero
            # TIMESTAMP: 1970-01-01 00:00:00 UTC itself is outside TIMESTAMP's range
            raise ZeroDateError("the zero TIMESTAMP ('0000-00-00 00:00:00') has no exact "
                                "counterpart; fix the value at the source, or set the source's "
                                "zero_dates: null")
        return None if t == "timestamptz" and value == EPOCH else value
    raise TypeError(f"unsupported logical type {t}")


def _zero_as(n: NativeColumn, parse: Callable, text: str, **kw) -> Any:
    try:
        return parse(text, **kw)
    except ZeroDateError:
        if n.zero_as_null:
            return None
        raise


def key_sql_value(n: NativeColumn, value: Any) -> Any:
    """A key value as the SQL value that compares with the column in its own order:
    ENUM and SET by their numbers (ORDER BY sorts them so, a string compares as text),
    numeric text as a Decimal (a string would compare as a double)."""
    if n.data_type == "enum" and isinstance(value, str):
        return n.set_values.index(value) + 1 if value in n.set_values else 0
    if n.data_type == "set" and isinstance(value, str):
        members = set(value.split(",")) if value else set()
        return sum(1 << i for i, m in enumerate(n.set_values) if m in members)
    if n.logical.startswith("numeric") and isinstance(value, str):
        return decimal.Decimal(value)
    return value


def _json_text(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, dict):
        return {_json_text(k): _json_text(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_text(x) for x in v]
    return v


# -- set-up checks (pure, so they can be unit-tested) -------------------------
def binlog_problems(variables: dict[str, Any]) -> list[Problem]:
    """Problems with the server's binlog settings (SHOW GLOBAL VARIABLES, lower-case names)."""
    v = {k.lower(): ("" if x is None else str(x)).upper() for k, x in variables.items()}
    out = []
    if v.get("log_bin") not in ("ON", "1"):
        out.append(Problem("the binary log is disabled (log_bin=OFF)",
                           "start the server with --log-bin (and a server-id) and restart it"))
        return out
    if v.get("binlog_format") != "ROW":
        out.append(Problem(f"binlog_format is {v.get('binlog_format') or 'unknown'}, not ROW",
                           "SET GLOBAL binlog_format=ROW and set binlog_format=ROW in the server "
                           "config (sessions started before keep their format)"))
    if v.get("binlog_row_image", "FULL") != "FULL":
        out.append(Problem(f"binlog_row_image is {v['binlog_row_image']}, not FULL",
                           "SET GLOBAL binlog_row_image=FULL and in the server config"))
    if v.get("binlog_order_commits") in ("OFF", "0"):
        out.append(Problem("binlog_order_commits is OFF: a transaction can become visible before "
                           "one logged ahead of it, so a chunk selected after its low watermark "
                           "could miss a change the log holds before it",
                           "SET GLOBAL binlog_order_commits=ON and in the server config"))
    if v.get("log_bin_compress") in ("ON", "1"):
        out.append(Problem("log_bin_compress is ON: compressed binlog events cannot be decoded, "
                           "their rows would be lost",
                           "SET GLOBAL log_bin_compress=OFF and in the server config"))
    if "binlog_row_metadata" in v and v["binlog_row_metadata"] != "FULL":
        out.append(Problem(f"binlog_row_metadata is {v['binlog_row_metadata']}, not FULL "
                           "(the binlog would carry no column names)",
                           "SET GLOBAL binlog_row_metadata=FULL and in the server config"))
    return out


_GRANT = re.compile(r"^\s*GRANT\s+(.+?)\s+ON\s+(\S+)\s+TO\s", re.I | re.S)


def _split_privileges(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [re.sub(r"\s*\(.*\)\s*$", "", p, flags=re.S).strip().upper() for p in out if p.strip()]


def global_privileges(grant_lines: Sequence[str]) -> set[str]:
    """Global (ON *.*) privileges named in SHOW GRANTS output; ALL PRIVILEGES -> {"ALL"}."""
    privs: set[str] = set()
    for line in grant_lines:
        m = _GRANT.match(line)
        if not m or m.group(2).replace("`", "") != "*.*":
            continue
        for p in _split_privileges(m.group(1)):
            p = " ".join(p.split())
            privs.add("ALL" if p in ("ALL", "ALL PRIVILEGES") else p)
    return privs


def privilege_problems(grant_lines: Sequence[str]) -> list[Problem]:
    privs = global_privileges(grant_lines)
    if "ALL" in privs:
        return []
    out = []
    if "REPLICATION SLAVE" not in privs and "REPLICATION REPLICA" not in privs:
        out.append(Problem("the user lacks the REPLICATION SLAVE privilege (needed to read the binlog)",
                           "GRANT REPLICATION SLAVE ON *.* TO <user>"))
    if not privs & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        out.append(Problem("the user lacks REPLICATION CLIENT / BINLOG MONITOR "
                           "(needed for SHOW MASTER STATUS)",
                           "GRANT REPLICATION CLIENT ON *.* TO <user> (MariaDB: BINLOG MONITOR)"))
    return out


_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_QNAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
_DDL = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(TRUNCATE(?:\s+TABLE)?|DROP\s+(?:TEMPORARY\s+)?TABLES?(?:\s+IF\s+EXISTS)?"
    r"|RENAME\s+TABLES?|CREATE\s+OR\s+REPLACE\s+(?:TEMPORARY\s+)?TABLE|DROP\s+(?:DATABASE|SCHEMA)"
    r"(?:\s+IF\s+EXISTS)?)\s+(.*)$", re.I | re.S)


def _unquote(ident: str) -> str:
    ident = ident.strip()
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def ddl_dropped_tables(query: str, default_db: str) -> tuple[str, list[str]]:
    """For DDL that removes a table's rows without row events (TRUNCATE, DROP TABLE,
    RENAME TABLE, CREATE OR REPLACE TABLE, DROP DATABASE): the statement's verb and
    the "db.table" names it touches ("db.*" for a whole database); else ("", [])."""
    m = _DDL.match(query)
    if not m:
        return "", []
    verb = " ".join(m.group(1).upper().split())
    if "TEMPORARY" in verb:  # a session's temporary table, not the captured one
        return "", []
    rest = re.sub(r"/\*.*?\*/", " ", m.group(2), flags=re.S)
    if verb.startswith(("DROP DATABASE", "DROP SCHEMA")):
        n = re.match(rf"\s*({_IDENT})", rest)
        return verb, [f"{_unquote(n.group(1))}.*"] if n else []
    names = []
    for q in re.findall(_QNAME, rest):
        parts = [_unquote(p) for p in re.split(rf"\s*\.\s*(?={_IDENT})", q, maxsplit=1)]
        if len(parts) == 1 and parts[0].upper() in ("TO", "IF", "EXISTS", "WAIT", "NOWAIT",
                                                       "RESTRICT", "CASCADE", "LIKE", "AS"):
            continue
        names.append(f"{parts[0]}.{parts[1]}" if len(parts) == 2 else f"{default_db}.{parts[0]}")
        if verb.startswith("CREATE") or verb.startswith("TRUNCATE"):
            break  # one table; the rest is its definition
    return verb, names


def _pymysql_connect(**settings):
    """mysql-replication passes the deprecated ``db`` keyword to PyMySQL."""
    if "db" in settings:
        settings["database"] = settings.pop("db")
    return pymysql.connect(**settings)


def binlog_file_number(name: str) -> int:
    m = re.search(r"\.(\d+)$", name)
    if not m:
        raise DBLogError(f"cannot read a file number from binlog file name {name!r}")
    return int(m.group(1))


# -- the source -----------------------------------------------------------------
class MySQLSource(SqlSource):
    """A MySQL/MariaDB source of the DBLog engine (see sources/base.py Source)."""

    to_logical = staticmethod(to_logical)
    needs_expr = staticmethod(_needs_expr)
    text_parsed = staticmethod(text_parsed)
    dialect = "mysql"
    value_errors = (pymysql.err.DataError,)

    heartbeat_s = 0.5          # binlog heartbeat: how soon an idle read_log yields Idle

    def __init__(self, config) -> None:
        super().__init__(config)
        self._engines: dict[str, str] = {}
    read_timeout_s = 30.0      # a silent binlog connection is dead after this long

    def __repr__(self) -> str:
        ep = self.config.endpoint
        return f"MySQLSource({self.name!r}, {ep.user}@{ep.host}:{ep.port})"

    # -- connections -------------------------------------------------------------
    def _connect(self, **extra) -> pymysql.connections.Connection:
        ep = self.config.endpoint
        return pymysql.connect(host=ep.host, port=int(ep.port), user=ep.user, password=ep.password,
                               charset="utf8mb4", autocommit=True, connect_timeout=10,
                               init_command=f"SET SESSION time_zone='{SESSION_TIME_ZONE}'", **extra)

    def _alive(self, conn, **extra):
        """``conn`` if it still answers, else a new connection (autocommit, so
        nothing is lost by reconnecting between statements)."""
        if conn is not None:
            try:
                conn.ping(False)
                return conn
            except pymysql.MySQLError:
                try:
                    conn.close()
                except Exception:
                    pass
        return self._connect(**extra)

    def _cursor(self):
        self._conn = self._alive(self._conn)
        return self._conn.cursor()

    def _query(self, sql: str, args: Sequence[Any] | None = None) -> list[tuple]:
        with self._lock:
            with self._cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())

    # -- checks ------------------------------------------------------------------
    def server_variables(self) -> dict[str, str]:
        rows = self._query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
            "'binlog_row_image', 'binlog_row_metadata', 'server_id', 'log_bin_compress', "
            "'binlog_order_commits')")
        return {str(k).lower(): str(v) for k, v in rows}

    def check(self, scan_values: bool = False) -> list[Problem]:
        """Everything that keeps this source from CDC, each with its fix; [] means ready.
        ``scan_values``: also scan each table once for values no target can hold
        (``value_problems``; ``dblog check`` does, a tail's start does not)."""
        try:
            variables = self.server_variables()
        except pymysql.MySQLError as e:
            ep = self.config.endpoint
            return [Problem(f"cannot connect to {ep.host}:{ep.port} as {ep.user}: {e}",
                            "check the host, port, user and password of the source")]
        problems = binlog_problems(variables)
        if variables.get("server_id") == str(self.config.server_id):
            problems.append(Problem(
                f"server_id {self.config.server_id} of the CDC reader equals the server's own",
                "set a different server_id for this source in the config"))
        try:
            grants = [r[0] for r in self._query("SHOW GRANTS")]
            problems += privilege_problems(grants)
        except pymysql.MySQLError as e:
            problems.append(Problem(f"cannot read the user's grants: {e}",
                                    "let the user run SHOW GRANTS"))
        if variables.get("log_bin", "").upper() in ("ON", "1") and not any(
                "REPLICATION CLIENT" in p.what for p in problems):
            try:
                self.current_resume()
            except (pymysql.MySQLError, SourceSetupError) as e:
                problems.append(Problem(f"SHOW MASTER STATUS failed: {e}",
                                        "GRANT REPLICATION CLIENT (MariaDB: BINLOG MONITOR) ON *.*"))
        try:
            self.ensure_watermark_table()
            self._query(f"UPDATE {quote_table(self.watermark_table)} SET value = value "
                        "WHERE id = 1 AND 1 = 0")
        except pymysql.MySQLError as e:
            problems.append(Problem(
                f"cannot create or write the watermark table {self.watermark_table}: {e}",
                f"GRANT CREATE, SELECT, INSERT, UPDATE ON {quote_ident(self.namespace)}.* TO <user>, "
                f"or create the database {self.namespace} for it"))
        for table in self.tables:
            try:
                self.refresh_schema(table)
            except (UnknownTableError, NoPrimaryKeyError, SourceSetupError) as e:
                fix = {UnknownTableError: "create the table or remove it from the config",
                       NoPrimaryKeyError: "add a PRIMARY KEY to the table (DBLog chunks and "
                                          "reconciles by primary key)",
                       SourceSetupError: "change the column type or stop capturing the table"}
                problems.append(Problem(str(e), fix[type(e)], table))
                continue
            except pymysql.MySQLError as e:
                problems.append(Problem(f"cannot read the table's definition: {e}",
                                        "grant SELECT on the table", table))
                continue
            try:
                self._query(f"SELECT 1 FROM {quote_table(table)} LIMIT 0")
            except pymysql.MySQLError as e:
                problems.append(Problem(f"cannot select from the table: {e}",
                                        f"GRANT SELECT ON {quote_table(table)} TO <user>", table))
                continue
            if scan_values:
                problems += self.value_problems(table)
        return problems

    def value_problems(self, table: str) -> list[Problem]:
        """Values of the table that no target can hold exactly (one scan of the table):
        zero or invalid dates (unless zero_dates: null), NUL characters in text (a
        PostgreSQL target's text cannot hold them). Each would hold the table's apply."""
        schema = self.table_schema(table)
        native = self.native_columns(table)
        checks = []
        for c in schema.columns:
            n, q = native[c.name], quote_ident(c.name)
            if n.data_type in ("date", "datetime", "timestamp") and not n.zero_as_null:
                checks.append((c.name, "zero or invalid dates ('0000-00-00', a zero month or day, "
                               "a day the month does not have)",
                               f"{q} IS NOT NULL AND COALESCE(YEAR({q}) = 0 OR MONTH({q}) = 0 OR "
                               f"DAYOFMONTH({q}) = 0 OR DAYOFMONTH(LAST_DAY({q})) < DAYOFMONTH({q}), 1)",
                               "UPDATE them to real dates or NULL, or set zero_dates: null for the "
                               "source (zero dates become NULL)"))
            elif c.type in ("string", "json") and n.data_type not in ("enum", "set"):
                checks.append((c.name, "NUL characters, which PostgreSQL text cannot hold",
                               f"INSTR({q}, CHAR(0)) > 0",
                               "remove the NUL characters, or make the column binary"))
        if not checks:
            return []
        sums = ", ".join(f"COALESCE(SUM({pred}), 0)" for _, _, pred, _ in checks)
        try:
            (counts,) = self._query(f"SELECT {sums} FROM {quote_table(table)}")
        except pymysql.MySQLError as e:
            return [Problem(f"cannot scan the table's values: {e}", "grant SELECT on the table", table)]
        return [Problem(f"{int(n):,} row(s) of column {name} hold {what}: no target holds them "
                        "exactly (the table's apply would stop before them)", fix, table)
                for (name, what, _, fix), n in zip(checks, counts) if int(n)]

    # -- schemas -----------------------------------------------------------------
    def _load_schema(self, table: str) -> None:
        db, _, name = table.partition(".")
        kind = self._query("SELECT TABLE_TYPE, ENGINE FROM information_schema.TABLES "
                           "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, name))
        if not kind:
            raise UnknownTableError(f"table {table} does not exist in source {self.name!r}")
        if kind[0][0] != "BASE TABLE":
            raise UnknownTableError(f"{table} is a {kind[0][0].lower()}, not a table: only base "
                                    "tables have row events in the binlog")
        cols = self._query(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, "
            "NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_OCTET_LENGTH, CHARACTER_SET_NAME "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION", (db, name))
        key = [r[0] for r in self._query(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (db, name))]
        json_cols = self._json_check_columns(db, name)
        columns, native = [], {}
        for cname, dtype, ctype, nullable, prec, scale, fsp, octets, charset in cols:
            dtype, ctype = str(dtype).lower(), str(ctype).lower()
            try:
                logical = logical_type(dtype, ctype, prec, scale, cname in json_cols)
                _check_charset(str(charset or "").lower())
            except ValueError as e:
                raise SourceSetupError(f"{table}.{cname}: {e}") from None
            length = 0
            if dtype == "binary":
                length = int(octets or 0)
            elif dtype == "bit":
                m = re.search(r"\((\d+)\)", ctype)
                length = int(m.group(1)) if m else 1
            native[cname] = NativeColumn(cname, dtype, ctype, logical,
                                         fsp=int(fsp or 0) if dtype == "time" else 0,
                                         length=length, set_values=_set_members(ctype),
                                         charset=str(charset or "").lower(),
                                         zero_as_null=self.config.zero_dates == "null")
            columns.append(Column(cname, logical, nullable == "YES"))
        schema = TableSchema(db, name, tuple(columns), tuple(key))  # NoPrimaryKeyError if no key
        self._schemas[table] = schema
        self._native[table] = native
        self._engines[table] = str(kind[0][1] or "").lower()

    def transactional(self, table: str) -> bool:
        """Whether the table's engine rolls back (MyISAM, Aria, MEMORY do not: their rows
        stay written when the transaction around them rolls back)."""
        self.table_schema(table)
        return self._engines.get(table) in _TRANSACTIONAL_ENGINES

    def _json_check_columns(self, db: str, name: str) -> set[str]:
        """MariaDB's JSON is LONGTEXT with a CHECK (json_valid(col)) constraint."""
        try:
            rows = self._query("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                               "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (db, name))
        except pymysql.MySQLError:  # MySQL: no TABLE_NAME there, and JSON is a real type
            return set()
        out = set()
        for (clause,) in rows:
            m = re.fullmatch(r"\s*json_valid\(\s*`((?:[^`]|``)+)`\s*\)\s*", str(clause), re.I)
            if m:
                out.add(m.group(1).replace("``", "`"))
        return out

    # -- watermarks --------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        wm = quote_table(self.watermark_table)
        self._query(f"CREATE DATABASE IF NOT EXISTS {quote_ident(self.namespace)}")
        self._query(f"CREATE TABLE IF NOT EXISTS {wm} ("
                    "id TINYINT NOT NULL PRIMARY KEY, "
                    "value CHAR(36) NOT NULL, "
                    "updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
                    ") ENGINE=InnoDB DEFAULT CHARSET=ascii")
        if not self._query(f"SELECT 1 FROM {wm} WHERE id = 1"):
            self._query(f"INSERT IGNORE INTO {wm} (id, value) VALUES (1, '')")

    def write_watermark(self, value: str) -> None:
        """One single-row UPDATE, alone in its own autocommit transaction."""
        if not isinstance(value, str) or not value or len(value) > 36:
            raise ValueError(f"a watermark is a UUID string of at most 36 characters, not {value!r}")
        sql = (f"UPDATE {quote_table(self.watermark_table)} "
               "SET value = %s, updated_at = NOW(6) WHERE id = 1")
        with self._wm_lock:
            self._wm_conn = self._alive(self._wm_conn, client_flag=CLIENT.FOUND_ROWS)
            with self._wm_conn.cursor() as cur:
                n = cur.execute(sql, (value,))
        if n != 1:
            raise WatermarkError(f"watermark row of {self.watermark_table} is missing "
                                 "(run ensure_watermark_table)")

    # -- chunks ------------------------------------------------------------------
    def max_key(self, table: TableSchema) -> tuple | None:
        keys = ", ".join(quote_ident(k) for k in table.key)
        desc = ", ".join(f"{quote_ident(k)} DESC" for k in table.key)
        rows = self._query(f"SELECT {keys} FROM {quote_table(table.qualified)} "
                           f"ORDER BY {desc} LIMIT 1")
        return self._typed_key(table, rows[0]) if rows else None

    def plan_chunk(self, table: TableSchema, after: tuple | None, upto: tuple, size: int,
                   parts: int) -> ChunkPlan | None:
        """The next at most ``size`` keys with after < key <= upto, split into at most
        ``parts`` partitions of near-equal key counts; one query over the primary key."""
        if size < 1 or parts < 1:
            raise ValueError("size and parts must be at least 1")
        p = _Params()
        cond = []
        if after is not None:
            cond.append(_key_after(table.key, self._key_sql(table, after), p))
        cond.append(_key_upto(table.key, self._key_sql(table, upto), p))
        keys = ", ".join(quote_ident(k) for k in table.key)
        sql = (
            f"SELECT {keys}, `__dblog_cnt` FROM ("
            f"SELECT {keys}, ROW_NUMBER() OVER (ORDER BY {keys}) AS `__dblog_rn`, "
            f"COUNT(*) OVER () AS `__dblog_cnt` FROM ("
            f"SELECT {keys} FROM {quote_table(table.qualified)} WHERE {' AND '.join(cond)} "
            f"ORDER BY {keys} LIMIT %s) AS `__dblog_chunk`) AS `__dblog_numbered` "
            "WHERE `__dblog_rn` = `__dblog_cnt` "
            "OR FLOOR(`__dblog_rn` * %s / `__dblog_cnt`) > FLOOR((`__dblog_rn` - 1) * %s / `__dblog_cnt`) "
            "ORDER BY `__dblog_rn`")
        return self._plan_from_rows(table, after, self._query(sql, p.args + [int(size), int(parts), int(parts)]))

    def range_predicates(self, table: TableSchema, plan: ChunkPlan) -> list[str]:
        """One WHERE predicate per partition, ``bounds[i] < key <= bounds[i+1]``, with
        literals rendered from the plan's bounds (Spark cannot bind parameters).

        They are written against ``jdbc_table(table)`` (a key column of type CHAR,
        ENUM, SET, TIME, ... is named by its raw alias there) and need the JDBC
        session of ``jdbc()`` (no NO_BACKSLASH_ESCAPES)."""
        cols = self._predicate_columns(table)
        out = []
        for lo, hi in zip(plan.bounds, plan.bounds[1:]):
            if hi is None:
                raise ValueError("a partition's upper bound cannot be None")
            parts = []
            if lo is not None:
                parts.append(_key_after(cols, self._key_sql(table, lo), sql_literal))
            parts.append(_key_upto(cols, self._key_sql(table, hi), sql_literal))
            out.append(" AND ".join(parts))
        return out

    def _key_sql(self, table: TableSchema, key: tuple) -> tuple:
        native = self.native_columns(table.qualified)
        return tuple(key_sql_value(native[k], v) for k, v in zip(table.key, key))

    def select_list(self, table: TableSchema) -> str:
        native = self.native_columns(table.qualified)
        return ", ".join(select_expr(native[c]) for c in table.column_names)

    def select_keys(self, table: TableSchema, keys: Sequence[tuple]) -> pa.Table:
        """The current rows of the given keys (bound parameters, autocommit statements)."""
        cols: dict[str, list] = {c: [] for c in table.column_names}
        base = f"SELECT {self.select_list(table)} FROM {quote_table(table.qualified)} WHERE "
        keys = list(dict.fromkeys(tuple(k) for k in keys))
        for i in range(0, len(keys), SELECT_BATCH):
            batch = keys[i:i + SELECT_BATCH]
            sql_keys = [self._key_sql(table, k) for k in batch]
            if len(table.key) == 1:
                where = f"{quote_ident(table.key[0])} IN ({', '.join(['%s'] * len(batch))})"
                args = [k[0] for k in sql_keys]
            else:
                one = "(" + " AND ".join(f"{quote_ident(k)} = %s" for k in table.key) + ")"
                where = " OR ".join([one] * len(batch))
                args = [v for k in sql_keys for v in k]
            self._append_rows(table, cols, self._query(base + where, args))
        return self._arrow(table, cols)

    def keys_where(self, table: TableSchema, condition: str, limit: int) -> list[tuple]:
        """Keys of the rows matching a user's WHERE condition (parsed strictly, values bound),
        in key order; at most ``limit`` + 1 so the caller can tell it was cut."""
        from ..conditions import parse_condition
        cond = parse_condition(table, condition, quote_ident)
        native = self.native_columns(table.qualified)
        exprs = ", ".join(select_expr(native[k]) for k in table.key)
        order = ", ".join(f"{quote_table(table.qualified)}.{quote_ident(k)}" for k in table.key)
        sql = (f"SELECT {exprs} FROM {quote_table(table.qualified)} WHERE {cond.sql} "
               f"ORDER BY {order} LIMIT {int(limit) + 1}")
        return [self._typed_key(table, row) for row in self._query(sql, list(cond.params))]

    # -- Spark JDBC ----------------------------------------------------------------
    def jdbc(self) -> tuple[str, dict[str, str]]:
        """URL and properties for spark.read.jdbc with MariaDB Connector/J 2.7.

        Verified with Spark 4.2 (local[2], JVM and session time zone America/New_York):
        chunk rows read through jdbc_table + range_predicates equal select_keys.

        - ``jdbc:mysql:`` makes Spark use its MySQL dialect (backtick quoting); the
          MariaDB driver accepts that scheme (``jdbc:mariadb:`` would make Spark
          quote with ``"``).
        - Driver options go in the URL (2.7 ignored some of them as properties):
          tinyInt1isBit=false keeps TINYINT(1) an integer, yearIsDateType=false,
          and serverTimezone=UTC + useLegacyDatetimeCode=false read DATETIME and
          TIMESTAMP as UTC wall-clock, the way the binlog decodes them, whatever
          the JVM's time zone.
        - sessionVariables: a known sql_mode without NO_BACKSLASH_ESCAPES (the
          literals of range_predicates escape backslashes) and a UTC session.
        - preferTimestampNTZ: DATETIME columns read as TIMESTAMP_NTZ.
        """
        ep = self.config.endpoint
        options = {"tinyInt1isBit": "false", "yearIsDateType": "false",
                   "useLegacyDatetimeCode": "false", "serverTimezone": "UTC"}
        url = (f"jdbc:mysql://{ep.host}:{int(ep.port)}/?"
               + "&".join(f"{k}={v}" for k, v in options.items()))
        props = {
            "driver": JDBC_DRIVER,
            "user": ep.user,
            "password": ep.password,
            "sessionInitStatement": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "sessionVariables": f"sql_mode='{JDBC_SQL_MODE}',time_zone='{SESSION_TIME_ZONE}'",
            "fetchsize": "10000",
            "preferTimestampNTZ": "true",
        }
        return url, props

    def jdbc_table(self, table: str | TableSchema) -> str:
        """spark.read.jdbc's ``table``: the quoted table, or a derived table of it when
        some column is read through an expression (select_expr). A key column read
        through an expression is also selected raw as ``raw_key_alias(name)``, which
        range_predicates use: MariaDB merges the derived table, so the predicates
        stay range scans on the primary key. Select ``table.column_names`` from the
        result (the aliases are extra columns)."""
        schema = table if isinstance(table, TableSchema) else self.table_schema(table)
        native = self.native_columns(schema.qualified)
        if not any(_needs_expr(native[c]) for c in schema.column_names):
            return quote_table(schema.qualified)
        exprs = [select_expr(native[c]) for c in schema.column_names]
        exprs += [f"{quote_ident(k)} AS {quote_ident(raw_key_alias(k))}"
                  for k in schema.key if _needs_expr(native[k])]
        return (f"(SELECT {', '.join(exprs)} FROM {quote_table(schema.qualified)}) "
                "AS `dblog_chunk`")

    # -- the binlog ----------------------------------------------------------------
    def current_resume(self) -> tuple[Position, dict]:
        rows = None
        for stmt in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
            try:
                rows = self._query(stmt)
                break
            except pymysql.err.ProgrammingError:
                continue
        if not rows:
            raise SourceSetupError(f"source {self.name!r}: the binary log is disabled "
                                   "(SHOW MASTER STATUS is empty); start the server with --log-bin")
        file, pos = str(rows[0][0]), int(rows[0][1])
        return Position(binlog_file_number(file), pos, 0), {"file": file, "pos": pos}

    def read_log(self, resume: dict | None, should_stop: Callable[[], bool],
                 server_id: int | None = None) -> Iterator[LogItem]:
        """Row changes of the configured tables, watermark writes, transaction ends and
        Idle (binlog heartbeats every ``heartbeat_s`` while caught up), from ``resume``
        (a TxnEnd's resume dict; None: the current end of the log).

        ``server_id`` defaults to the config's; concurrent readers need different ones."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.constants import FIELD_TYPE
        from pymysqlreplication.event import (HeartbeatLogEvent, NotImplementedEvent, QueryEvent,
                                              RotateEvent, XAPrepareEvent, XidEvent)
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        if resume is None:
            _, resume = self.current_resume()
        file, pos = str(resume["file"]), int(resume["pos"])
        file_no = binlog_file_number(file)
        schemas = {t: self.table_schema(t) for t in self.tables}
        natives = {t: self._native[t] for t in self.tables}
        wm = self.watermark_table
        ep = self.config.endpoint
        stream = BinLogStreamReader(
            connection_settings={"host": ep.host, "port": int(ep.port), "user": ep.user,
                                 "password": ep.password, "connect_timeout": 10,
                                 "read_timeout": max(self.read_timeout_s, 4 * self.heartbeat_s)},
            server_id=int(server_id if server_id is not None else self.config.server_id),
            log_file=file, log_pos=pos, resume_stream=True, blocking=True,
            slave_heartbeat=self.heartbeat_s, is_mariadb=False, pymysql_wrapper=_pymysql_connect,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent,
                         RotateEvent, HeartbeatLogEvent, XAPrepareEvent, NotImplementedEvent],
            filter_non_implemented_events=False,
            only_schemas=sorted({t.split(".", 1)[0] for t in self.tables} | {self.namespace}),
            only_tables=sorted({t.split(".", 1)[1] for t in self.tables} | {WATERMARK_TABLE}),
            enable_logging=False)

        in_txn = False          # between BEGIN and its commit
        captured_in_txn = 0     # rows of watched tables in the open transaction
        # the open transaction's row changes, given out at its commit: a ROLLBACK (a
        # transaction that also wrote a non-transactional table is logged, then rolled
        # back) or a ROLLBACK TO SAVEPOINT drops those of transactional tables
        txn: list[Event] = []
        savepoints: dict[str, int] = {}
        transactional = {t: self.transactional(t) for t in self.tables}
        converters: dict[str, _RowConverter] = {}

        def committed() -> Iterator[RowChange]:
            nonlocal txn
            out, txn = txn, []
            savepoints.clear()
            return (RowChange(e) for e in out)

        def rolled_back(since: int) -> None:
            nonlocal txn
            txn = txn[:since] + [e for e in txn[since:] if not transactional[e.table]]
        connects = 0

        def txn_end(offset: int) -> TxnEnd:
            return TxnEnd(Position(file_no, offset, 0), {"file": file, "pos": offset})

        try:
            while not should_stop():
                ev = stream.fetchone()
                if ev is None:  # the server ended the stream (shutdown?)
                    if in_txn:
                        raise DBLogError("the binlog stream ended inside a transaction; "
                                         "restart from the last checkpoint")
                    yield Idle()
                    time.sleep(self.heartbeat_s)
                    continue
                if isinstance(ev, HeartbeatLogEvent):
                    yield Idle()
                    continue
                if isinstance(ev, NotImplementedEvent):
                    if ev.event_type in COMPRESSED_EVENTS:
                        raise SourceSetupError(
                            f"the binlog of source {self.name!r} holds a compressed event (type "
                            f"{ev.event_type}, log_bin_compress=ON) that the reader cannot decode: "
                            "its rows would be lost. SET GLOBAL log_bin_compress=OFF (and in the "
                            "server config), then re-dump the tables and move the tail's checkpoint "
                            "past the compressed events")
                    continue
                if isinstance(ev, RotateEvent):
                    if ev.timestamp == 0:  # sent at each (re)connect
                        connects += 1
                        if connects > 1 and in_txn:
                            raise DBLogError("the binlog connection was re-established inside a "
                                             "transaction; restart from the last checkpoint")
                        if connects > 1:
                            log.info("binlog connection of %s re-established at %s:%s",
                                     self.name, ev.next_binlog, ev.position)
                    file = ev.next_binlog
                    file_no = binlog_file_number(file)
                    if ev.timestamp != 0 and not in_txn:  # a real rotation: a clean boundary
                        yield txn_end(int(ev.position))
                    continue
                offset = ev.packet.log_pos  # where the next event starts
                if isinstance(ev, XidEvent):
                    in_txn, captured_in_txn = False, 0
                    yield from committed()
                    yield txn_end(offset)
                    continue
                if isinstance(ev, XAPrepareEvent):
                    if captured_in_txn:
                        raise DBLogError("an XA transaction changed captured tables; XA "
                                         "transactions are not supported")
                    in_txn = False
                    yield txn_end(offset)
                    continue
                if isinstance(ev, QueryEvent):
                    q = " ".join(str(ev.query).split()).upper().rstrip(";")
                    if q in ("BEGIN", "START TRANSACTION") or q.startswith("XA START"):
                        in_txn, captured_in_txn = True, 0
                    elif not in_txn or q in ("COMMIT", "ROLLBACK"):
                        # COMMIT of a non-transactional engine, or DDL (its own transaction)
                        if not in_txn:
                            self._check_ddl(ev, Position(file_no, offset, 0))
                        if q == "ROLLBACK":
                            rolled_back(0)
                        in_txn, captured_in_txn = False, 0
                        yield from committed()
                        yield txn_end(offset)
                    else:   # SAVEPOINT / ROLLBACK TO inside a transaction: not an end
                        text = " ".join(str(ev.query).split()).rstrip(";")
                        m = _SAVEPOINT.match(text) if _SAVEPOINT_Q.match(text) else None
                        if m and m.group(1):
                            rolled_back(savepoints.get(_unquote(m.group(2)), 0))
                        elif m:
                            savepoints[_unquote(m.group(2))] = len(txn)
                    continue
                # a rows event
                table = f"{ev.schema}.{ev.table}"
                if table != wm and table not in schemas:
                    continue
                in_txn = True
                start = ev.packet.log_pos - ev.packet.event_size
                ts = int(ev.timestamp) * 1000
                if table == wm:
                    if isinstance(ev, DeleteRowsEvent):
                        continue
                    for i, row in enumerate(ev.rows):
                        values = row["after_values"] if isinstance(ev, UpdateRowsEvent) else row["values"]
                        if "value" not in values:
                            raise SourceSetupError(
                                f"the binlog carries no column names for {wm}: "
                                "SET GLOBAL binlog_row_metadata=FULL (and in the server config)")
                        value = values["value"]
                        if isinstance(value, bytes):
                            value = value.decode("ascii")
                        yield WatermarkSeen(str(value).strip(), Position(file_no, start, i))
                        if should_stop():
                            return
                    continue
                schema = schemas[table]
                conv = converters.get(table)
                if conv is None:
                    conv = converters[table] = _RowConverter(schema, natives[table])
                self._check_binlog_key(schema, ev.primary_key)
                rows = ev.rows  # decodes every row image of the event
                if not rows:
                    continue
                fix_time = conv.fix_time(ev.columns, FIELD_TYPE.TIME2) if conv.has_time else _NO_NAMES
                seq = 0
                if isinstance(ev, UpdateRowsEvent):
                    conv.check_names(rows, "before_values")
                    conv.check_names(rows, "after_values")
                    for row in rows:
                        before, kb, wb = conv.image(row["before_values"], row["before_none_sources"], fix_time)
                        after, ka, wa = conv.image(row["after_values"], row["after_none_sources"], fix_time)
                        if kb == ka:
                            txn.append(Event(table, UPDATE, kb, before, after,
                                                  Position(file_no, start, seq), ts, wa))
                            seq += 1
                        else:  # a primary-key change: the old key goes, the new one comes
                            txn.append(Event(table, DELETE, kb, before, None,
                                                  Position(file_no, start, seq), ts,
                                                  wb if conv.uncarried_key(kb) else None))
                            txn.append(Event(table, INSERT, ka, None, after,
                                                  Position(file_no, start, seq + 1), ts, wa))
                            seq += 2
                else:
                    conv.check_names(rows, "values")
                    insert = isinstance(ev, WriteRowsEvent)
                    for row in rows:
                        image, key, why = conv.image(row["values"], row["none_sources"], fix_time)
                        if insert:
                            txn.append(Event(table, INSERT, key, None, image,
                                                  Position(file_no, start, seq), ts, why))
                        else:
                            txn.append(Event(table, DELETE, key, image, None,
                                                  Position(file_no, start, seq), ts,
                                                  why if conv.uncarried_key(key) else None))
                        seq += 1
                captured_in_txn += seq
                # once per rows event, not per row: a stop only ever discards the open
                # (uncommitted) transaction, so checking here loses nothing
                if should_stop():
                    return
        finally:
            stream.close()

    def _check_ddl(self, ev: Any, pos: Position) -> None:
        """DDL that empties or replaces a captured table writes no row events: stop."""
        db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
        verb, names = ddl_dropped_tables(str(ev.query), db)
        for name in names:
            hit = [t for t in self.tables
                   if t == name or (name.endswith(".*") and t.split(".", 1)[0] == name[:-2])]
            if hit:
                err = SchemaChangedError(
                    f"{verb} of {', '.join(hit)} at binlog position {pos}: its rows changed without "
                    "row events; re-dump the table (and move the log checkpoint past this "
                    "statement)")
                err.tables = hit
                err.pos = pos
                raise err

    @staticmethod
    def _check_binlog_key(schema: TableSchema, primary_key: Any) -> None:
        if not primary_key:  # no key metadata (e.g. a prefix key): nothing to compare
            return
        key = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
        if set(key) != set(schema.key):
            raise SchemaChangedError(
                f"the primary key of {schema.qualified} is now ({', '.join(key)}), was "
                f"({', '.join(schema.key)}): update the capture's schema and re-dump the table")


_NO_NAMES: frozenset = frozenset()


def _fast_check(n: NativeColumn, var: str) -> str | None:
    """A Python expression true when ``var`` (not None) is already exactly what
    to_logical would return for it (so it is kept as it is), or None when every
    value of the column goes through to_logical."""
    t = n.logical
    if n.data_type == "datetime":
        return f"({var}.__class__ is _datetime and {var}.tzinfo is None)"
    if n.data_type == "timestamp":   # 1970-01-01 00:00:00 is the zero TIMESTAMP
        return f"({var}.__class__ is _datetime and {var}.tzinfo is None and {var} != _EPOCH)"
    if n.data_type == "date":
        return f"{var}.__class__ is _date"
    if n.data_type == "year":
        return f"({var}.__class__ is int and {var} != 1900)"
    if n.data_type in _SPECIAL:
        return None
    if t in _PLAIN:
        return f"{var}.__class__ is {_PLAIN[t].__name__}"
    if t in _INT_BITS:
        lim = _INT_LIMIT[t]
        return f"({var}.__class__ is int and {-lim} <= {var} < {lim})"
    if t.startswith("decimal("):
        return f"{var}.__class__ is _Decimal"   # to_logical: Decimal(value), an equal Decimal
    return None


# MariaDB's compressed query and rows events (log_bin_compress=ON): mysql-replication
# has no decoder for them, so they would pass unseen
COMPRESSED_EVENTS = frozenset(range(165, 172))
_TRANSACTIONAL_ENGINES = {"innodb", "xtradb", "rocksdb", "tokudb"}
_SAVEPOINT = re.compile(r"^(ROLLBACK\s+(?:WORK\s+)?TO\s+)?(?:SAVEPOINT\s+)?(`(?:[^`]|``)+`|\S+)$", re.I)
_SAVEPOINT_Q = re.compile(r"^\s*(?:SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO)\s", re.I)

# a key value that could not be carried: the key is still told apart from every other
# (no real value of a date or number column is a string starting with "!")
UNCARRIED_KEY = "!uncarried:"


class _RowConverter:
    """Binlog row images of one table -> (row dict of logical values, key tuple).

    Built once per table: the per-column checks are compiled into one function,
    so the common value (already of its logical type's exact Python type, in range)
    costs one inline type test and anything else goes through ``to_logical``, which
    raises on a type the captured schema does not expect (the table changed).

    A value no target can hold (UncarriedValueError) becomes None in the row, and
    ``errors`` names it; the caller turns the row's event into a held one
    (``Event.error``) and calls ``take_errors``."""

    def __init__(self, schema: TableSchema, native: dict[str, NativeColumn]):
        self.schema = schema
        self.names = list(schema.column_names)
        self.natives = [native[c] for c in self.names]
        self.has_time = any(n.data_type == "time" for n in self.natives)
        self.errors: list[tuple[str, str]] = []   # (column, why) of the last converted images
        pos = {c: i for i, c in enumerate(self.names)}
        lines = ["def convert(values, none_sources, fix_time):"]
        vs = [f"v{i}" for i in range(len(self.names))]
        lines.append(f"    {', '.join(vs)}{',' if len(vs) == 1 else ''} = values.values()")
        for i, n in enumerate(self.natives):
            v = vs[i]
            fast = _fast_check(n, v)
            slow = f"{v} = _slow({i}, {v}, none_sources, fix_time)"
            if n.data_type in ("set", "date", "datetime", "timestamp"):
                # None may be an empty set or a zero date (none_sources says which)
                lines.append(f"    if {v} is None: {v} = _slow({i}, None, none_sources, fix_time)")
                lines.append(f"    elif not {fast}: {slow}" if fast is not None else f"    else: {slow}")
            elif fast is None:
                lines.append(f"    if {v} is not None: {slow}")
            else:
                lines.append(f"    if {v} is not None and not {fast}: {slow}")
        row = ", ".join(f"{self.names[i]!r}: {v}" for i, v in enumerate(vs))
        key = "".join(f"{vs[pos[k]]}, " for k in schema.key)
        lines.append(f"    return {{{row}}}, ({key})")
        env = {"_slow": self._slow, "_Decimal": decimal.Decimal, "_datetime": dt.datetime,
               "_date": dt.date, "_EPOCH": EPOCH}
        exec(compile("\n".join(lines), f"<row converter {schema.qualified}>", "exec"), env)
        self.convert = env["convert"]

    def __call__(self, values: dict, none_sources: dict, fix_time) -> tuple[dict, tuple]:
        return self.convert(values, none_sources, fix_time)

    def image(self, values: dict, none_sources: dict, fix_time) -> tuple[dict, tuple, str | None]:
        """(row, key, why): ``why`` names the values that could not be carried (None if all were)."""
        row, key = self.convert(values, none_sources, fix_time)
        if not self.errors:
            return row, key, None
        why, key = self.take_errors(row, key, values)
        return row, key, why

    @staticmethod
    def uncarried_key(key: tuple) -> bool:
        return any(isinstance(v, str) and v.startswith(UNCARRIED_KEY) for v in key)

    def take_errors(self, row: dict, key: tuple, values: dict) -> tuple[str, tuple]:
        """The error text of the last converted image, and its key (a key column that
        could not be carried is named by its raw value); clears ``errors``."""
        why = "; ".join(f"{self.schema.qualified}.{c}: {e}" for c, e in self.errors)
        bad = {c for c, _ in self.errors}
        if bad & set(self.schema.key):
            key = tuple(f"{UNCARRIED_KEY}{values.get(k)!r}" if k in bad else row[k]
                        for k in self.schema.key)
        self.errors = []
        return why, key

    def check_names(self, rows: list, image: str) -> None:
        names = self.names
        for row in rows:
            if list(row[image]) != names:
                got = list(row[image])
                if got and str(got[0]).startswith("UNKNOWN_COL"):
                    raise SourceSetupError(
                        f"the binlog carries no column names for {self.schema.qualified}: "
                        "SET GLOBAL binlog_row_metadata=FULL (and in the server config)")
                raise SchemaChangedError(
                    f"the columns of {self.schema.qualified} changed (ALTER TABLE?): the binlog has "
                    f"{got}, the captured schema {names}; update the capture's schema "
                    "and re-dump the table")

    def fix_time(self, columns: Sequence[Any], time2: int) -> frozenset:
        return frozenset(c.name for c in columns if c.type == time2 and getattr(c, "fsp", 0))

    def _slow(self, i: int, value: Any, none_sources: dict, fix_time) -> Any:
        n = self.natives[i]
        name = n.name
        if value is None and n.data_type == "set" and none_sources.get(name) == "empty set":
            value = ""
        elif name in fix_time and isinstance(value, dt.timedelta):
            value = _fix_negative_time2(value)
        try:
            return to_logical(n, value, none_sources.get(name) if value is None else None)
        except UncarriedValueError as e:
            self.errors.append((name, str(e)))
            return None
        except (TypeError, ValueError) as e:
            raise SchemaChangedError(
                f"{self.schema.qualified}.{name} ({n.column_type}): {e}; the column's type changed "
                "(ALTER TABLE?): update the capture's schema and re-dump the table") from None
