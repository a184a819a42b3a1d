"""The messages of pgoutput, PostgreSQL's built-in logical replication protocol, as
``pgoutput.decode`` returns them (field names as in the PostgreSQL manual, "Logical
Replication Message Formats"). LSNs are ints (lsn.py gives their text form).

Nothing here imports Airflow.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional, Union

#: One column of a TupleData: (kind, value). kind is 'n' (NULL, value None),
#: 'u' (unchanged TOASTed value, value None), 't' (text format, value bytes) or
#: 'b' (binary format, value bytes).
TupleColumn = tuple[str, Optional[bytes]]
TupleData = list[TupleColumn]


@dataclass(frozen=True)
class Begin:
    """'B': a transaction starts; ``final_lsn`` is its commit record's LSN."""
    final_lsn: int
    commit_ts: dt.datetime
    xid: int


@dataclass(frozen=True)
class Message:
    """'M': a logical decoding message (``pg_logical_emit_message``; needs the
    ``messages`` option)."""
    flags: int          # 1: transactional
    lsn: int
    prefix: str
    content: bytes
    xid: Optional[int] = None

    @property
    def transactional(self) -> bool:
        """Emitted as part of its transaction (given at the commit, dropped with a
        rollback), not at once whatever becomes of the transaction."""
        return bool(self.flags & 1)


@dataclass(frozen=True)
class _CommitFields:
    """What a Commit and a Stream Commit both carry."""
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: dt.datetime


@dataclass(frozen=True)
class Commit(_CommitFields):
    """'C': the transaction committed; a restart resumes from ``end_lsn``."""


@dataclass(frozen=True)
class Origin:
    """'O': the transaction came from another replication origin."""
    commit_lsn: int     # the commit's LSN on the origin server
    name: str


@dataclass(frozen=True)
class RelationColumn:
    """One column of a Relation message."""
    flags: int
    name: str
    type_oid: int
    atttypmod: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (every column under FULL)."""
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    """'R': a table's shape, sent before its first change in a session and after it changes."""
    oid: int
    namespace: str      # empty string for pg_catalog
    name: str
    replica_identity: str   # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: list[RelationColumn]
    xid: Optional[int] = None   # only inside a streamed transaction (proto 2)


@dataclass(frozen=True)
class Type:
    """'Y': a data type that is not built in (sent before a Relation using it)."""
    oid: int
    namespace: str
    name: str
    xid: Optional[int] = None


@dataclass(frozen=True)
class Insert:
    """'I': a new row."""
    relation_oid: int
    new: TupleData
    xid: Optional[int] = None


@dataclass(frozen=True)
class Update:
    """'U': a changed row (the old row or key only as the replica identity gives it)."""
    relation_oid: int
    old: Optional[TupleData]    # 'O': the whole old row (REPLICA IDENTITY FULL)
    key: Optional[TupleData]    # 'K': the old key, sent only when the key changed
    new: TupleData
    xid: Optional[int] = None


@dataclass(frozen=True)
class Delete:
    """'D': a deleted row."""
    relation_oid: int
    old: Optional[TupleData]    # REPLICA IDENTITY FULL
    key: Optional[TupleData]    # DEFAULT / INDEX: key columns set, the rest 'n'
    xid: Optional[int] = None


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


@dataclass(frozen=True)
class Truncate:
    """'T': TRUNCATE of one or more tables (``options``: TRUNCATE_* bits)."""
    options: int
    relation_oids: list[int]
    xid: Optional[int] = None


@dataclass(frozen=True)
class StreamStart:
    """'S': a segment of a streamed (still running) transaction starts (protocol 2)."""
    xid: int
    first_segment: bool


@dataclass(frozen=True)
class StreamStop:
    """'E': the current segment of a streamed transaction ends (protocol 2)."""


@dataclass(frozen=True)
class StreamCommit(_CommitFields):
    """'c': a streamed transaction committed (protocol 2): a Commit's fields and its xid."""
    xid: int


@dataclass(frozen=True)
class StreamAbort:
    """'A': a streamed transaction (or a subtransaction of it) aborted (protocol 2)."""
    xid: int
    subxid: int


AnyMessage = Union[Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate,
                   Message, StreamStart, StreamStop, StreamCommit, StreamAbort]
