"""Decoder of PostgreSQL's built-in logical replication protocol, ``pgoutput``.

Pure Python (``struct``), written from the protocol description in the PostgreSQL
manual ("Logical Replication Message Formats"). Protocol version 1 is decoded in
full; the version 2 additions (the transaction id that messages carry inside a
streamed transaction, and the Stream Start / Stop / Commit / Abort messages) are
decoded when ``decode(..., in_stream=True)`` is asked for.

``decode(payload)`` turns one pgoutput payload (as returned by
``pg_logical_slot_*_binary_changes`` or carried by a walsender XLogData message)
into a message of pgoutput_messages.py. Unknown or truncated payloads raise
``ValueError``. Values stay text here: text_values.py parses them, and
relation_cache.py turns tuples into dicts by their Relation.

Nothing here imports Airflow.
"""
from __future__ import annotations

import datetime as dt
import struct

from .pgoutput_messages import (AnyMessage, Begin, Commit, Delete, Insert, Message, Origin, Relation,
                                RelationColumn, StreamAbort, StreamCommit, StreamStart, StreamStop,
                                Truncate, TupleData, Type, Update)

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


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
