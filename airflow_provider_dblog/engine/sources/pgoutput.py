"""Decoder of PostgreSQL's built-in logical replication protocol, ``pgoutput``.

Pure Python (``struct``), written from the protocol description in the PostgreSQL
manual ("Logical Replication Message Formats"). Protocol version 1 is decoded in
full; the version 2 additions (the transaction id that messages carry inside a
streamed transaction, and the Stream Start / Stop / Commit / Abort messages) are
decoded when ``decode(..., in_stream=True)`` is asked for.

Three layers:

* ``decode(payload)``: one pgoutput payload (as returned by
  ``pg_logical_slot_*_binary_changes`` or carried by a walsender XLogData message)
  into a dataclass. Unknown or truncated payloads raise ``ValueError``.
* ``convert(type_oid, text)``: a value in PostgreSQL's text output format into a
  Python value, by type OID (pgoutput sends every value as text unless the
  subscriber asked for ``binary``).
* ``RelationCache``: remembers Relation messages and turns the tuples of Insert /
  Update / Delete into ``{column: value}`` dicts. A TOASTed column that an UPDATE did
  not touch is sent without its value; it comes back as ``UNCHANGED_TOAST``, never
  as ``None``.

Text formats assumed (the session that runs the decoding decides them, so set
them on the replication connection): ``DateStyle=ISO`` (the default), any
``TimeZone`` (offsets are parsed), ``bytea_output=hex`` (the default),
``IntervalStyle`` is irrelevant (interval is kept as text).

Nothing here imports Airflow.
"""
from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

# -- messages -------------------------------------------------------------------------

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)

#: One column of a TupleData: (kind, value). kind is 'n' (NULL, value None),
#: 'u' (unchanged TOASTed value, value None), 't' (text format, value bytes) or
#: 'b' (binary format, value bytes).
Column = tuple[str, Optional[bytes]]
TupleData = list[Column]


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_ts: dt.datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: dt.datetime


@dataclass(frozen=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True)
class RelationColumn:
    flags: int          # 1: part of the replica identity (every column under FULL)
    name: str
    type_oid: int
    atttypmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str      # empty string for pg_catalog
    name: str
    replica_identity: str   # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: list[RelationColumn]
    xid: Optional[int] = None   # only inside a streamed transaction (proto 2)


@dataclass(frozen=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: Optional[int] = None


@dataclass(frozen=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: Optional[int] = None


@dataclass(frozen=True)
class Update:
    relation_oid: int
    old: Optional[TupleData]    # 'O': the whole old row (REPLICA IDENTITY FULL)
    key: Optional[TupleData]    # 'K': the old key, sent only when the key changed
    new: TupleData
    xid: Optional[int] = None


@dataclass(frozen=True)
class Delete:
    relation_oid: int
    old: Optional[TupleData]    # REPLICA IDENTITY FULL
    key: Optional[TupleData]    # DEFAULT / INDEX: key columns set, the rest 'n'
    xid: Optional[int] = None


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


@dataclass(frozen=True)
class Truncate:
    options: int
    relation_oids: list[int]
    xid: Optional[int] = None


@dataclass(frozen=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``; needs the
    ``messages`` option)."""
    flags: int          # 1: transactional
    lsn: int
    prefix: str
    content: bytes
    xid: Optional[int] = None

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True)
class StreamStop:
    pass


@dataclass(frozen=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: dt.datetime


@dataclass(frozen=True)
class StreamAbort:
    xid: int
    subxid: int


AnyMessage = Union[Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate,
                   Message, StreamStart, StreamStop, StreamCommit, StreamAbort]


class _Reader:
    """Big-endian reads over one payload; every short read is a ValueError."""

    __slots__ = ("buf", "pos", "kind")

    def __init__(self, buf: bytes, kind: str):
        self.buf = buf
        self.pos = 1
        self.kind = kind

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise ValueError(f"pgoutput {self.kind!r} message truncated: need {n} byte(s) at "
                             f"offset {self.pos}, payload has {len(self.buf)}")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self._take(1)[0]

    def byte(self) -> str:
        return chr(self._take(1)[0])

    def i16(self) -> int:
        return struct.unpack(">h", self._take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self._take(8))[0]

    def ts(self) -> dt.datetime:
        micros = struct.unpack(">q", self._take(8))[0]
        return PG_EPOCH + dt.timedelta(microseconds=micros)

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ValueError(f"pgoutput {self.kind!r} message truncated: unterminated string "
                             f"at offset {self.pos}")
        out = self.buf[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return out

    def tuple_data(self) -> TupleData:
        n = self.i16()
        cols: TupleData = []
        for _ in range(n):
            kind = self.byte()
            if kind in ("n", "u"):
                cols.append((kind, None))
            elif kind in ("t", "b"):
                length = self.i32()
                cols.append((kind, bytes(self._take(length))))
            else:
                raise ValueError(f"pgoutput {self.kind!r} message: unknown tuple column kind "
                                 f"{kind!r} at offset {self.pos - 1}")
        return cols

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ValueError(f"pgoutput {self.kind!r} message: {len(self.buf) - self.pos} "
                             f"trailing byte(s)")


def decode(payload: bytes, *, in_stream: bool = False) -> AnyMessage:
    """Decode one pgoutput message.

    ``in_stream``: the message sits between a Stream Start and a Stream Stop
    (protocol version 2 with ``streaming`` on); such messages carry the xid of the
    streamed transaction before their usual fields.
    """
    buf = bytes(payload)
    if not buf:
        raise ValueError("pgoutput message is empty")
    kind = chr(buf[0])
    r = _Reader(buf, kind)
    xid = None
    if in_stream and kind in "RYIUDTM":
        xid = r.u32()

    if kind == "B":
        msg: AnyMessage = Begin(final_lsn=r.u64(), commit_ts=r.ts(), xid=r.u32())
    elif kind == "C":
        msg = Commit(flags=r.u8(), commit_lsn=r.u64(), end_lsn=r.u64(), commit_ts=r.ts())
    elif kind == "O":
        msg = Origin(commit_lsn=r.u64(), name=r.string())
    elif kind == "R":
        oid = r.u32()
        namespace = r.string()
        name = r.string()
        ident = r.byte()
        cols = []
        for _ in range(r.i16()):
            cols.append(RelationColumn(flags=r.u8(), name=r.string(), type_oid=r.u32(),
                                       atttypmod=r.i32()))
        msg = Relation(oid, namespace, name, ident, cols, xid)
    elif kind == "Y":
        msg = Type(oid=r.u32(), namespace=r.string(), name=r.string(), xid=xid)
    elif kind == "I":
        oid = r.u32()
        tag = r.byte()
        if tag != "N":
            raise ValueError(f"pgoutput 'I' message: expected 'N', got {tag!r}")
        msg = Insert(oid, r.tuple_data(), xid)
    elif kind == "U":
        oid = r.u32()
        old = key = None
        tag = r.byte()
        if tag == "O":
            old = r.tuple_data()
            tag = r.byte()
        elif tag == "K":
            key = r.tuple_data()
            tag = r.byte()
        if tag != "N":
            raise ValueError(f"pgoutput 'U' message: expected 'N', got {tag!r}")
        msg = Update(oid, old, key, r.tuple_data(), xid)
    elif kind == "D":
        oid = r.u32()
        tag = r.byte()
        if tag == "O":
            msg = Delete(oid, r.tuple_data(), None, xid)
        elif tag == "K":
            msg = Delete(oid, None, r.tuple_data(), xid)
        else:
            raise ValueError(f"pgoutput 'D' message: expected 'O' or 'K', got {tag!r}")
    elif kind == "T":
        n = r.i32()
        options = r.u8()
        msg = Truncate(options, [r.u32() for _ in range(n)], xid)
    elif kind == "M":
        flags = r.u8()
        lsn = r.u64()
        prefix = r.string()
        content = bytes(r._take(r.i32()))
        msg = Message(flags, lsn, prefix, content, xid)
    elif kind == "S":
        msg = StreamStart(xid=r.u32(), first_segment=bool(r.u8()))
    elif kind == "E":
        msg = StreamStop()
    elif kind == "c":
        msg = StreamCommit(xid=r.u32(), flags=r.u8(), commit_lsn=r.u64(), end_lsn=r.u64(),
                           commit_ts=r.ts())
    elif kind == "A":
        # protocol 4 (parallel streaming) appends abort LSN and timestamp: not read
        msg = StreamAbort(xid=r.u32(), subxid=r.u32())
        return msg
    else:
        raise ValueError(f"unknown pgoutput message type {kind!r} (first byte {buf[0]:#04x})")
    r.done()
    return msg


def lsn_to_str(lsn: int) -> str:
    """The usual ``X/X`` form of an LSN."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


# -- text values ----------------------------------------------------------------------

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


# -- relations ------------------------------------------------------------------------

class _UnchangedToast:
    """A TOASTed column an UPDATE did not change: pgoutput does not send its value.
    The caller must keep the value it already has (never write NULL for it)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self):
        return (_UnchangedToast, ())

    def __bool__(self) -> bool:
        return False


UNCHANGED_TOAST = _UnchangedToast()


@dataclass(frozen=True)
class RowChange:
    """An Insert / Update / Delete with its tuples as dicts.

    ``before``: the old row (FULL) or the old key (only key columns), or None when
    pgoutput sent neither (an UPDATE under DEFAULT identity that kept its key).
    ``after``: the new row (None for a delete)."""
    op: str                     # 'insert' | 'update' | 'delete'
    relation: Relation
    before: Optional[dict]
    after: Optional[dict]
    before_is_key_only: bool


@dataclass
class RelationCache:
    """Relation messages by oid (pgoutput sends one before a relation's first change
    in a session and again after its schema changes), and the tuple -> dict step."""

    relations: dict[int, Relation] = field(default_factory=dict)
    types: dict[int, Type] = field(default_factory=dict)

    def add(self, msg: AnyMessage) -> None:
        """Remember a Relation or Type message (anything else is ignored)."""
        if isinstance(msg, Relation):
            self.relations[msg.oid] = msg
        elif isinstance(msg, Type):
            self.types[msg.oid] = msg

    def relation(self, oid: int) -> Relation:
        try:
            return self.relations[oid]
        except KeyError:
            raise KeyError(f"no Relation message seen for relation oid {oid}") from None

    def to_dict(self, rel: Relation, tup: TupleData, key_only: bool = False) -> dict:
        if len(tup) != len(rel.columns):
            raise ValueError(f"tuple has {len(tup)} columns, relation {rel.namespace}."
                             f"{rel.name} has {len(rel.columns)}")
        out: dict = {}
        for col, (kind, raw) in zip(rel.columns, tup):
            if key_only and not col.is_key:
                continue
            if kind == "n":
                out[col.name] = None
            elif kind == "u":
                out[col.name] = UNCHANGED_TOAST
            elif kind == "t":
                out[col.name] = convert(col.type_oid, raw.decode("utf-8"))
            else:   # 'b': binary format (the 'binary' option); left to the caller
                out[col.name] = raw
        return out

    def row_change(self, msg: Union[Insert, Update, Delete]) -> RowChange:
        rel = self.relation(msg.relation_oid)
        if isinstance(msg, Insert):
            return RowChange("insert", rel, None, self.to_dict(rel, msg.new), False)
        before, key_only = None, False
        if msg.old is not None:
            before = self.to_dict(rel, msg.old)
        elif msg.key is not None:
            before, key_only = self.to_dict(rel, msg.key, key_only=True), True
        if isinstance(msg, Update):
            return RowChange("update", rel, before, self.to_dict(rel, msg.new), key_only)
        return RowChange("delete", rel, before, None, key_only)
