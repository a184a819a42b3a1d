"""The binlog read with mysql-event-stream (``decoder: mysql-event-stream``): its compiled
client takes the replication stream and its compiled engine decodes the row images of the
captured tables; everything else (transactions, statements, watermarks, shape checks) is
BinlogReader's, unchanged.

The client's poll blocks until an event or the server's heartbeat (half its read timeout),
so it runs in a thread of its own and hands over batches of raw events: the reader gives
Idle whenever nothing came for ``heartbeat_s``, as with the other decoder. Rows events of
tables not captured are skipped by their table id without being decoded at all.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ...errors import DBLogError
from ...events import DELETE, INSERT, UPDATE
from ..base import Idle, LogItem
from .binlog import COMPRESSED_EVENTS, BinlogReader, PartialImageError, full_image, partial_image_why
from .mes_events import (FORMAT_DESCRIPTION, QUERY, ROTATE, ROWS, TABLE_MAP, XA_PREPARE, XID,
                         LibraryEvents, columns_present, header, table_id, table_map_names)
from .mes_rows import MesRowConverter
from .rows import RowConverter

log = logging.getLogger(__name__)

_BATCH = 512            # raw events per poll
_QUEUED_BATCHES = 4     # batches the client thread may be ahead of the reader
# one row may be as large as the server lets it (max_allowed_packet, up to 1 GiB): the
# client's own 32 MiB default would refuse it. Its queue is bounded by events instead
_MAX_EVENT, _QUEUED_EVENTS = 1 << 30, 256
# the client's codes of a stream that broke off (the connection killed, the server gone):
# MES_ERR_STREAM, MES_ERR_DISCONNECTED; the tail retries them like any lost connection
_CUT = (403, 404)


@dataclass
class _Packet:
    log_pos: int      # where the next event starts
    event_size: int


@dataclass
class MesRowsEvent:
    """One rows event, decoded: what BinlogReader's handlers read of mysql-replication's."""
    schema: str
    table: str
    columns: list           # the TABLE_MAP's columns (mysql-replication's Column objects)
    primary_key: Any
    packet: _Packet
    timestamp: int
    kind: str
    changes: list           # mysql-event-stream ChangeEvents, one per row
    partial: bool = False   # it logs only some columns: not decoded (PartialImageError)

    @property
    def rows(self) -> list[dict]:
        """The rows in mysql-replication's shape (the watermark table's values)."""
        if self.kind == UPDATE:
            return [{"before_values": c.before, "after_values": c.after} for c in self.changes]
        return [{"values": c.before if self.kind == DELETE else c.after} for c in self.changes]


class _Polling(threading.Thread):
    """Polls the client and queues its batches (or the error that ended it)."""

    def __init__(self, client: Any):
        super().__init__(name="dblog-binlog-poll", daemon=True)
        self.client, self.out = client, queue.Queue(_QUEUED_BATCHES)
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self._put(self.client.poll_batch(_BATCH))
        except BaseException as e:   # handed to the reader, which raises it
            self._put(e)

    def _put(self, item: Any) -> None:
        """Into the queue, unless the reader stops meanwhile (then nobody takes it)."""
        while not self.stopping.is_set():
            try:
                self.out.put(item, timeout=0.2)
                return
            except queue.Full:
                continue


class MesBinlogReader(BinlogReader):
    converter_class = MesRowConverter

    def read(self, should_stop: Callable[[], bool]) -> Iterator[LogItem]:
        from mysql_event_stream import CdcEngine
        from pymysqlreplication.constants import FIELD_TYPE
        self.time2 = FIELD_TYPE.TIME2   # for rows decoded by the library (_library_rows)
        self.should_stop = should_stop
        self.library = LibraryEvents()
        self.maps: dict[int, tuple[str, bytes, bool]] = {}   # table id -> (table, TABLE_MAP bytes, checksum)
        self.parsed: dict[bytes, Any] = {}    # a TABLE_MAP's body -> mysql-replication's parse of it
        self.fed: bytes | None = None         # the TABLE_MAP the engine holds last
        self.by_library: set[str] = set()     # tables whose rows the engine could not decode
        watched = set(self.tables) | {self.watermark_table}
        client = self._connect()
        polling = _Polling(client)
        polling.start()
        try:
            with CdcEngine() as engine:
                self.engine = engine
                while not should_stop():
                    try:
                        batch = polling.out.get(timeout=self.settings.heartbeat_s)
                    except queue.Empty:
                        yield Idle()
                        continue
                    if isinstance(batch, ConnectionError) or getattr(batch, "code", None) in _CUT:
                        raise ConnectionError(f"the binlog stream of source {self.settings.source_name!r} "
                                              f"was cut: {batch}") from batch   # the server away: retried
                    if isinstance(batch, BaseException):
                        raise DBLogError(f"the binlog stream of source {self.settings.source_name!r} "
                                         f"failed: {batch}") from batch
                    for result in batch:
                        if result.data is None:
                            yield Idle()
                            continue
                        yield from self._on_raw(result.data, result.checksum_enabled, watched)
                        if self.stopped:
                            return
        finally:
            polling.stopping.set()
            client.stop()
            polling.join(timeout=max(5.0, self.settings.read_timeout_s))
            client.close()

    def _connect(self) -> Any:
        from mysql_event_stream import BinlogClient
        s, ep = self.settings, self.settings.endpoint
        client = BinlogClient(
            host=ep.host, port=int(ep.port), user=ep.user, password=ep.password, server_id=s.server_id,
            start_binlog_file=self.file, start_binlog_position=self.start_pos, connect_timeout_s=10,
            read_timeout_s=int(max(s.read_timeout_s, 4 * s.heartbeat_s, 2)), ssl_mode=1,
            max_event_size=_MAX_EVENT, max_queue_bytes=_MAX_EVENT + (64 << 20), max_queue_size=_QUEUED_EVENTS)
        client.connect()
        client.start()
        return client

    def _on_raw(self, data: bytes, checksum: bool, watched: set[str]) -> Iterator[LogItem]:
        h = header(data)
        kind = ROWS.get(h.type)
        if kind is not None:
            entry = self.maps.get(table_id(data))
            if entry is not None:
                yield from self._on_rows(self._decoded(entry, data, checksum, h, kind), kind)
        elif h.type == TABLE_MAP:
            schema, name = table_map_names(data)
            table = f"{schema}.{name}"
            if table in watched:
                self.maps[table_id(data)] = (table, data, checksum)
            else:
                self.maps.pop(table_id(data), None)
        elif h.type == XID:
            yield from self._commit(h.next_pos)
        elif h.type in (QUERY, ROTATE, XA_PREPARE, FORMAT_DESCRIPTION):
            ev = self.library.parse(data, checksum)
            if h.type == FORMAT_DESCRIPTION:
                self.engine.set_checksum_enabled(checksum)
                self.engine.feed(data)
            elif ev is not None:
                yield from {QUERY: self._on_query, ROTATE: self._on_rotate,
                            XA_PREPARE: self._on_xa_prepare}[h.type](ev)
        elif h.type in COMPRESSED_EVENTS:
            yield from self._on_not_implemented(_Compressed(h.type))

    def _decoded(self, entry: tuple[str, bytes, bool], data: bytes, checksum: bool, h: Any, kind: str) -> Any:
        """The rows event decoded by the compiled engine (a MesRowsEvent); an event it cannot
        parse, by the library (its RowsEvent: mysql-event-stream 1.8 refuses a spatial column
        beside a text column), so that one table's layout never stops the source."""
        table, table_map, map_checksum = entry
        body = table_map[25:-4] if map_checksum else table_map[25:]
        parsed = self.parsed.get(body)
        if parsed is None:
            parsed = self.parsed[body] = self.library.parse(table_map, map_checksum)
        schema, _, name = table.partition(".")
        ev = MesRowsEvent(schema, name, parsed.columns, parsed.table_obj.data["primary_key"],
                          _Packet(h.next_pos, h.size), h.timestamp, kind, [])
        n, present = columns_present(data, kind)
        if not all(full_image(b, n) for b in present):
            ev.partial = True
            return ev
        engine = self.engine
        try:
            if self.fed is not table_map:
                engine.set_checksum_enabled(map_checksum)
                engine.feed(table_map)
                self.fed = table_map
            engine.set_checksum_enabled(checksum)
            engine.feed(data)
            while (c := engine.next_event()) is not None:
                ev.changes.append(c)
        except RuntimeError as e:   # MesError: ParseError, DecodeError
            engine.reset()
            self.fed = None
            if table not in self.by_library:
                self.by_library.add(table)
                log.warning("%s: mysql-event-stream cannot decode its rows (%s); they are decoded by "
                            "mysql-replication", table, e)
            self.library.parse(table_map, map_checksum)
            return self.library.parse(data, checksum)
        return ev

    def _converter(self, table: str, ev: Any) -> RowConverter:
        wanted = MesRowConverter if isinstance(ev, MesRowsEvent) else RowConverter
        conv = self.converters.get(table)
        if type(conv) is not wanted:
            captured = self.tables[table]
            conv = self.converters[table] = wanted(captured.schema, captured.native)
        return conv

    def _images(self, conv: RowConverter, ev: Any, kind: str) -> list[tuple]:
        if not isinstance(ev, MesRowsEvent):   # decoded by the library
            return super()._images(conv, ev, kind)
        if ev.partial:
            raise PartialImageError(partial_image_why(ev.schema, ev.table))
        changes = ev.changes
        if not changes:
            return []
        first = changes[0].before if kind == DELETE else changes[0].after
        conv.check_keys(first, changes[0].names_resolved)
        image = conv.image
        if kind == UPDATE:
            return [(image(c.before, {}, None), image(c.after, {}, None)) for c in changes]
        if kind == INSERT:
            return [(None, image(c.after, {}, None)) for c in changes]
        return [(image(c.before, {}, None), None) for c in changes]


@dataclass
class _Compressed:
    event_type: int
