"""Raw binlog events (as mysql-event-stream's client hands them over) -> what the reader needs.

The compiled decoder (mysql-event-stream) decodes row images; the few other events the
reader acts on (query, rotate, XA prepare, the TABLE_MAP's column metadata for the shape
check) are parsed by mysql-replication's own event classes from the same bytes, so there is
one parser of each event kind, not a second one written here. Only the 19-byte common
header and the TABLE_MAP / rows post-header's table id and names are read here: they decide,
per event and cheaply, whether an event is for a captured table at all.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .logged_labels import install, true_labels

HEADER = struct.Struct("<IBIIIH")   # timestamp, type, server id, event size, next position, flags
QUERY, ROTATE, FORMAT_DESCRIPTION, XID, TABLE_MAP, XA_PREPARE = 2, 4, 15, 16, 19, 38
ROWS_V1 = {23: "insert", 24: "update", 25: "delete"}   # MariaDB's
ROWS_V2 = {30: "insert", 31: "update", 32: "delete"}   # MySQL's (and MariaDB's with binlog v2 rows)
ROWS = {**ROWS_V1, **ROWS_V2}


@dataclass(frozen=True)
class Header:
    timestamp: int
    type: int
    size: int
    next_pos: int

    @property
    def start(self) -> int:
        """Where the event starts in its binlog file."""
        return self.next_pos - self.size


def header(data: bytes) -> Header:
    ts, typ, _, size, next_pos, _ = HEADER.unpack_from(data, 0)
    return Header(ts, typ, size, next_pos)


def table_id(data: bytes) -> int:
    """The table id of a TABLE_MAP or rows event (6 bytes after the header)."""
    return int.from_bytes(data[19:25], "little")


def columns_present(data: bytes, kind: str) -> tuple[int, list[bytes]]:
    """A rows event's column count and its columns-present bitmaps (two for an update):
    after the table id (6) and flags (2), a v2 event's extra data (its length counts its own
    2 bytes), then the count as a length-encoded integer, then the bitmaps."""
    at = 27
    if data[4] in ROWS_V2:
        at += int.from_bytes(data[27:29], "little")
    first = data[at]
    if first < 251:
        n, at = first, at + 1
    else:   # 0xfc: 2 bytes, 0xfd: 3, 0xfe: 8
        size = {252: 2, 253: 3, 254: 8}[first]
        n, at = int.from_bytes(data[at + 1:at + 1 + size], "little"), at + 1 + size
    width = (n + 7) // 8
    maps = [data[at:at + width]]
    if kind == "update":
        maps.append(data[at + width:at + 2 * width])
    return n, maps


def table_map_names(data: bytes) -> tuple[str, str]:
    """(schema, table) of a TABLE_MAP event: after the table id (6) and flags (2), a
    length-prefixed, NUL-terminated schema name, then the same for the table name."""
    at = 27
    n = data[at]
    schema = data[at + 1:at + 1 + n].decode("utf-8")
    at += 2 + n
    m = data[at]
    return schema, data[at + 1:at + 1 + m].decode("utf-8")


class _Control:
    """What mysql-replication's event classes ask of their control connection (nothing
    is queried: the TABLE_MAP carries names and types, binlog_row_metadata=FULL)."""
    charset = "utf8mb4"

    def _get_dbms(self) -> str:
        return "mariadb"


class LibraryEvents:
    """Builds mysql-replication event objects from raw event bytes: the format
    description's post-header lengths and the server version carry from one to the next,
    as in the library's own stream."""

    def __init__(self):
        from pymysqlreplication import event, row_event
        install()   # the library reads ENUM / SET labels as logged (logged_labels.py)
        self._allowed = frozenset((event.QueryEvent, event.RotateEvent, event.FormatDescriptionEvent,
                                   event.XAPrepareEvent, row_event.TableMapEvent, row_event.WriteRowsEvent,
                                   row_event.UpdateRowsEvent, row_event.DeleteRowsEvent))
        self._control = _Control()
        self.version: tuple = (10, 11, 0)
        self.post_header_lengths = None
        self.table_map: dict = {}

    def parse(self, data: bytes, checksum: bool) -> Any:
        from pymysql.protocol import MysqlPacket
        from pymysqlreplication.packet import BinLogPacketWrapper
        packet = BinLogPacketWrapper(
            MysqlPacket(b"\x00" + bytes(data), "utf8mb4"), self.table_map, self._control, self.version,
            checksum, self._allowed, None, None, None, None, False, False, False, True, False, False,
            self.post_header_lengths)
        ev = packet.event
        if data[4] == FORMAT_DESCRIPTION and ev is not None:
            self.version, self.post_header_lengths = ev.mysql_version, ev.post_header_len
        elif data[4] == TABLE_MAP and ev is not None:
            true_labels(ev)
        return ev
