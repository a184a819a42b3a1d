"""MySQL column types: the logical type (engine/schema.py) of each, what else a
value's conversion needs (``NativeColumn``), and the SELECT expression that reads a
column the way the binlog decodes it (``select_expr``)."""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from .sql import quote_ident

_INTS = {"tinyint": ("int8", "int16"), "smallint": ("int16", "int32"),
         "mediumint": ("int32", "int32"), "int": ("int32", "int64"),
         "integer": ("int32", "int64"), "bigint": ("int64", "decimal(20,0)")}
_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set",
            "nchar", "nvarchar"}
_BINARIES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry",
             "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
             "geometrycollection", "geomcollection"}
INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}

# MariaDB's latin1 is cp1252 with the five bytes cp1252 leaves undefined (0x81, 0x8D, 0x8F,
# 0x90, 0x9D) as the C1 controls of the same number: double-encoded UTF-8 holds them ('Á'
# is C3 81), and Python's cp1252 raises on them
MARIADB_LATIN1 = "dblog_mariadb_latin1"
_LATIN1_TABLE = "".join(bytes([b]).decode("cp1252", "replace").replace("\ufffd", chr(b)) for b in range(256))
_LATIN1_ENCODING = codecs.charmap_build(_LATIN1_TABLE)


def _latin1_codec(name: str) -> codecs.CodecInfo | None:
    if name != MARIADB_LATIN1:
        return None
    return codecs.CodecInfo(name=MARIADB_LATIN1,
                            encode=lambda s, errors="strict": codecs.charmap_encode(s, errors, _LATIN1_ENCODING),
                            decode=lambda b, errors="strict": codecs.charmap_decode(b, errors, _LATIN1_TABLE))


codecs.register(_latin1_codec)

# single-byte character sets (but latin1) decoded by the server's own table of their 256
# bytes (catalog.load_decode_tables, read where the log is read): Python's codecs differ on
# some bytes (greek 0xA1, tis620), and where the server gives '?' (no character) the dump
# gives '?' too
_SERVER_PREFIX = "dblog_server_"
_SERVER_TABLES: dict[str, str] = {}   # charset -> its 256 characters ('\ufffe': none)


def add_decode_table(charset: str, chars: list[str | None]) -> None:
    """Register the server's characters of bytes 0..255 of ``charset`` (once per process:
    codecs caches lookups). A byte whose text is not one character stays undecodable."""
    if charset in _SERVER_TABLES or len(chars) != 256:
        return
    _SERVER_TABLES[charset] = "".join(c if isinstance(c, str) and len(c) == 1 else "\ufffe"
                                      for c in chars)


def has_decode_table(charset: str) -> bool:
    return charset in _SERVER_TABLES


def _server_codec(name: str) -> codecs.CodecInfo | None:
    table = _SERVER_TABLES.get(name[len(_SERVER_PREFIX):]) if name.startswith(_SERVER_PREFIX) else None
    if table is None:
        return None
    return codecs.CodecInfo(name=name, encode=_no_encode,
                            decode=lambda b, errors="strict": codecs.charmap_decode(b, errors, table))


def _no_encode(s: str, errors: str = "strict"):
    # many bytes may give '?': text cannot be encoded back exactly
    raise ValueError("the server's decode tables only decode")


codecs.register(_server_codec)

# MySQL character sets whose Python codec has another name
_CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": MARIADB_LATIN1,
           "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le",
           "utf32": "utf-32-be", "binary": "latin-1", "koi8r": "koi8-r", "koi8u": "koi8-u",
           "sjis": "shift_jis", "ujis": "euc_jp", "eucjpms": "euc_jp", "euckr": "cp949",
           "gb2312": "gb2312", "gbk": "gbk", "big5": "big5", "cp932": "cp932", "greek": "iso8859-7",
           "hebrew": "iso8859-8", "latin2": "iso8859-2", "latin5": "iso8859-9",
           "latin7": "iso8859-13", "tis620": "cp874", "macroman": "mac-roman"}
# decoded wrongly by mysql-replication 1.0.17 (as little-endian): refused
_BAD_CHARSETS = {"utf16", "utf32"}
# read as their text: TIME is carried as text; dates through engine/values.py (no JDBC
# date types, so no Java calendar; zero dates are seen)
_TEXT_READ = {"time", "char", "nchar", "enum", "set", "date", "datetime", "timestamp"}


def check_charset(charset: str) -> None:
    """ValueError if values of this character set cannot be decoded exactly."""
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
        return codec_of(self.charset)


def codec_of(charset: str) -> str:
    """The Python codec that decodes text of a MySQL character set as the server does."""
    if charset in _SERVER_TABLES:
        return _SERVER_PREFIX + charset
    return python_codec(charset)


def python_codec(charset: str) -> str:
    """Python's own codec of a MySQL character set (it also encodes)."""
    return _CODECS.get(charset, charset or "utf-8")


def bit_length(column_type: str) -> int:
    """n of a BIT(n) column type (BIT alone is BIT(1))."""
    m = re.search(r"\((\d+)\)", column_type)
    return int(m.group(1)) if m else 1


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
        bits = bit_length(column_type)
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


# how information_schema and SHOW CREATE TABLE print a character of an ENUM / SET label
# (the server's append_unescaped): a quote doubled, and a backslash, NUL, LF and CR escaped
_LABEL_ESCAPES = {"''": "'", "\\\\": "\\", "\\0": "\0", "\\n": "\n", "\\r": "\r"}


def set_members(column_type: str) -> tuple[str, ...]:
    """The members of an ENUM(...) or SET(...) column type, in declaration order."""
    m = re.match(r"^\s*(?:set|enum)\s*\((.*)\)\s*$", column_type, re.S | re.I)
    if not m:
        return ()
    return tuple(re.sub(r"''|\\[\\0nr]", lambda e: _LABEL_ESCAPES[e.group()], v)
                 for v in re.findall(r"'((?:[^']|'')*)'", m.group(1)))


def prints_as(label: str, printed: str, marks: int = 1) -> bool:
    """Whether an ENUM / SET ``label`` prints as ``printed`` in the catalog (utf8mb3:
    information_schema, SHOW CREATE TABLE): the same characters, but each character outside
    the BMP, which prints as one '?' (a '?' is also itself); ``marks`` 4: one '?' for each of
    its bytes (a CHARACTER SET binary label)."""
    return printed == "".join("?" * marks if ord(c) > 0xFFFF else c for c in label)


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


def text_parsed(n: NativeColumn) -> bool:
    """Selected as text that engine/values.py parses into the logical type."""
    return n.data_type in ("date", "datetime", "timestamp") or n.logical.startswith("numeric")


def needs_expr(n: NativeColumn) -> bool:
    """Read through an expression (so key predicates name the raw alias)."""
    return select_expr(n) != quote_ident(n.name)
