"""Reading the binlog (mysql-replication): row changes of the captured tables,
watermark writes, transaction ends and Idle, one handler per kind of event.

Positions are (binlog file number, start offset of the rows event, row index in
the event). A TxnEnd sits at the offset of the event after the commit, so it is
greater than every event of its transaction and not greater than any later one.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pymysql

from ...config import Endpoint
from ...errors import DBLogError, SchemaChangedError, SourceSetupError
from ...events import DELETE, INSERT, UPDATE, Event
from ...positions import Position
from ..base import Idle, LogItem, RowChange, TxnEnd, WatermarkSeen
from .binlog_shapes import ShapeHandlers
from .captured import CapturedTable, check_binlog_key, logged_shape_problem
from .ddl import read_statement, savepoint_statement
from .logged_labels import install, true_labels
from .rows import NO_NAMES, RowConverter, raw_text

log = logging.getLogger(__name__)

# MariaDB's compressed query and rows events (log_bin_compress=ON): mysql-replication
# has no decoder for them, so they would pass unseen
COMPRESSED_EVENTS = frozenset(range(165, 172))


class PartialImageError(DBLogError):
    """A rows event that logs only some of the table's columns."""


def full_image(bitmap: bytes, columns: int) -> bool:
    """Whether a rows event's columns-present bitmap names all ``columns``."""
    every = (1 << columns) - 1
    return int.from_bytes(bitmap, "little") & every == every


def partial_image_why(schema: str, table: str) -> str:
    return (f"a rows event of {schema}.{table} logs only some of its columns: the session that wrote it "
            "set binlog_row_image to MINIMAL or NOBLOB, so the rows cannot be carried whole. Keep every "
            "session at binlog_row_image=FULL (SET GLOBAL and the server config; a session can override it)")


def binlog_file_number(name: str) -> int:
    m = re.search(r"\.(\d+)$", name)
    if not m:
        raise DBLogError(f"cannot read a file number from binlog file name {name!r}")
    return int(m.group(1))


def _pymysql_connect(**settings):
    """mysql-replication passes the deprecated ``db`` keyword to PyMySQL."""
    if "db" in settings:
        settings["database"] = settings.pop("db")
    return pymysql.connect(**settings)


@dataclass(frozen=True)
class StreamSettings:
    """Where and how the reader connects (see MySQLSource.read_log)."""
    source_name: str
    endpoint: Endpoint
    server_id: int
    heartbeat_s: float
    read_timeout_s: float
    stream_txn_after: int = 10_000  # a transaction's changes held before they are given out early


class BinlogReader(ShapeHandlers):
    """One read of the binlog from a resume point (a TxnEnd's resume dict).

    The open transaction's row changes are held and given out at its commit: a
    ROLLBACK (a transaction that also wrote a non-transactional table is logged,
    then rolled back) or a ROLLBACK TO SAVEPOINT drops those of transactional tables.
    Past ``stream_txn_after`` held changes (and while no savepoint is set) they are given
    out early, so that a large transaction is never held whole (the tail writes it in
    parts, invisible until its TxnEnd); a whole ROLLBACK of such a transaction fails closed."""
    converter_class = RowConverter   # of one table's row images (mes_reader: MesRowConverter)

    def __init__(self, settings: StreamSettings, tables: dict[str, CapturedTable],
                 watermark_table: str, resume: dict,
                 refresh: Callable[[str], CapturedTable] | None = None):
        """``refresh(table)``: the table's shape read again from the catalog, after an
        ALTER TABLE of it (then SchemaChange is given out at the statement's position);
        ``replay(statement, old)``, set after: the shape after an ALTER past which the catalog is."""
        self.settings, self.tables, self.refresh, self.replay = settings, tables, refresh, None
        self.watermark_table = watermark_table
        self.file = str(resume["file"])
        self.file_no = binlog_file_number(self.file)
        self.start_pos = int(resume["pos"])
        self.in_txn = False          # between BEGIN and its commit
        self.captured_in_txn = 0     # rows of watched tables in the open transaction
        self.txn: list[Event] = []
        self.streamed = 0            # changes of the open transaction already given out
        self.streamed_tables: set[str] = set()   # the tables they are of
        self.savepoints: dict[str, int] = {}
        self.converters: dict[str, RowConverter] = {}
        self.logged_shapes: dict[str, list] = {}   # each table's TABLE_MAP columns found to match its shape
        self.unreadable: dict[str, bool] = {}   # rows skipped (_other_shape) -> broken since the last watermark
        self.connects = 0
        self.should_stop: Callable[[], bool] = lambda: False
        self.stopped = False         # a handler saw should_stop() mid-event
        self.time2 = 0               # mysql-replication's FIELD_TYPE.TIME2

    def read(self, should_stop: Callable[[], bool]) -> Iterator[LogItem]:
        # imported here: the library is only needed (and loaded) by a reading process
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.constants import FIELD_TYPE
        from pymysqlreplication.event import (HeartbeatLogEvent, NotImplementedEvent, QueryEvent,
                                              RotateEvent, XAPrepareEvent, XidEvent)
        from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

        # the stream gives only these classes (exactly: it filters by class), so
        # type(event) picks the handler
        handlers = {
            WriteRowsEvent: lambda ev: self._on_rows(ev, INSERT),
            UpdateRowsEvent: lambda ev: self._on_rows(ev, UPDATE),
            DeleteRowsEvent: lambda ev: self._on_rows(ev, DELETE),
            XidEvent: lambda ev: self._commit(ev.packet.log_pos),   # where the next event starts
            QueryEvent: self._on_query, RotateEvent: self._on_rotate,
            HeartbeatLogEvent: lambda ev: iter((Idle(),)), XAPrepareEvent: self._on_xa_prepare,
            NotImplementedEvent: self._on_not_implemented,
            TableMapEvent: self._on_table_map,
        }
        install()   # the library reads ENUM / SET labels as logged (logged_labels.py)
        self.time2 = FIELD_TYPE.TIME2
        self.should_stop = should_stop
        stream = self._open(BinLogStreamReader, list(handlers))
        try:
            while not should_stop():
                ev = stream.fetchone()
                if ev is None:
                    yield from self._on_stream_end()
                    continue
                yield from handlers[type(ev)](ev)
                if self.stopped:
                    return
        finally:
            stream.close()

    @staticmethod
    def _on_table_map(ev: Any) -> Iterator[LogItem]:
        true_labels(ev)   # its ENUM / SET labels as logged (logged_labels.py), before its rows use them
        return iter(())

    def _open(self, stream_class: type, events: list[type]):
        s, ep = self.settings, self.settings.endpoint
        db, _, wm_name = self.watermark_table.partition(".")
        return stream_class(
            connection_settings={"host": ep.host, "port": int(ep.port), "user": ep.user,
                                 "password": ep.password, "connect_timeout": 10,
                                 "read_timeout": max(s.read_timeout_s, 4 * s.heartbeat_s)},
            server_id=s.server_id, log_file=self.file, log_pos=self.start_pos, resume_stream=True,
            blocking=True, slave_heartbeat=s.heartbeat_s, is_mariadb=False,
            pymysql_wrapper=_pymysql_connect, only_events=events, filter_non_implemented_events=False,
            only_schemas=sorted({t.split(".", 1)[0] for t in self.tables} | {db}),
            only_tables=sorted({t.split(".", 1)[1] for t in self.tables} | {wm_name}),
            enable_logging=False)

    # -- transactions --------------------------------------------------------------
    def _txn_end(self, offset: int) -> TxnEnd:
        return TxnEnd(Position(self.file_no, offset, 0), {"file": self.file, "pos": offset})

    def _commit(self, offset: int) -> Iterator[LogItem]:
        """The open transaction's changes, then its end."""
        out, self.txn, self.streamed = self.txn, [], 0
        self.streamed_tables.clear()
        self.savepoints.clear()
        self.in_txn, self.captured_in_txn = False, 0
        yield from (RowChange(e) for e in out)
        yield self._txn_end(offset)

    def _roll_back(self, since: int, whole: bool = False) -> None:
        """Drop the held changes of transactional tables from the ``since``-th on. Changes
        given out early precede any savepoint (none is set while they are given out, see
        _on_rows), so only a whole ROLLBACK would need them back: MariaDB logs none of a
        rolled-back transaction's transactional changes, but a server that did fails closed."""
        given_out = sorted(t for t in self.streamed_tables if self.tables[t].transactional)
        if whole and given_out:
            raise DBLogError(
                f"a transaction of over {self.streamed} row changes was rolled back after its changes of "
                f"{', '.join(given_out)} were given out (a ROLLBACK logged because it also wrote a "
                "non-transactional table): the tail cannot take them back, so it stops here. "
                "`dblog reset --confirm` the source (a re-dump)")
        self.txn = self.txn[:since] + [e for e in self.txn[since:]
                                       if not self.tables[e.table].transactional]

    # -- one handler per kind of event ---------------------------------------------
    def _on_stream_end(self) -> Iterator[LogItem]:
        """The server ended the stream (shutdown?)."""
        if self.in_txn:
            raise DBLogError("the binlog stream ended inside a transaction; "
                             "restart from the last checkpoint")
        yield Idle()
        time.sleep(self.settings.heartbeat_s)

    def _on_not_implemented(self, ev: Any) -> Iterator[LogItem]:
        if ev.event_type in COMPRESSED_EVENTS:
            raise SourceSetupError(
                f"the binlog of source {self.settings.source_name!r} holds a compressed event (type "
                f"{ev.event_type}, log_bin_compress=ON) that the reader cannot decode: "
                "its rows would be lost. SET GLOBAL log_bin_compress=OFF (and in the "
                "server config), then re-dump the tables and move the tail's checkpoint "
                "past the compressed events")
        return iter(())

    def _on_rotate(self, ev: Any) -> Iterator[LogItem]:
        if ev.timestamp == 0:  # sent at each (re)connect
            self.connects += 1
            if self.connects > 1 and self.in_txn:
                raise DBLogError("the binlog connection was re-established inside a "
                                 "transaction; restart from the last checkpoint")
            if self.connects > 1:
                log.info("binlog connection of %s re-established at %s:%s",
                         self.settings.source_name, ev.next_binlog, ev.position)
        self.file = ev.next_binlog
        self.file_no = binlog_file_number(self.file)
        if ev.timestamp != 0 and not self.in_txn:  # a real rotation: a clean boundary
            yield self._txn_end(int(ev.position))

    def _on_xa_prepare(self, ev: Any) -> Iterator[LogItem]:
        if self.captured_in_txn:
            raise DBLogError("an XA transaction changed captured tables; XA "
                             "transactions are not supported")
        self.in_txn = False
        yield self._txn_end(ev.packet.log_pos)

    def _on_query(self, ev: Any) -> Iterator[LogItem]:
        offset = ev.packet.log_pos
        q = " ".join(str(ev.query).split()).upper().rstrip(";")
        if q in ("BEGIN", "START TRANSACTION") or q.startswith("XA START"):
            self.in_txn, self.captured_in_txn = True, 0
        elif not self.in_txn or q in ("COMMIT", "ROLLBACK"):
            # COMMIT of a non-transactional engine, or DDL (its own transaction)
            if not self.in_txn:
                db = (ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes)
                      else str(ev.schema or ""))
                pos = Position(self.file_no, offset, 0)
                for statement in read_statement(str(ev.query), db, list(self.tables), getattr(ev, "sql_mode", None)):
                    yield from self._on_statement(statement, pos, int(ev.timestamp) * 1000)
            if q == "ROLLBACK":
                self._roll_back(0, whole=True)
            yield from self._commit(offset)
        else:   # SAVEPOINT / ROLLBACK TO inside a transaction: not an end
            savepoint = savepoint_statement(ev.query)
            if savepoint is not None:
                rollback, name = savepoint
                if rollback:
                    self._roll_back(self.savepoints.get(name, 0))
                else:
                    self.savepoints[name] = len(self.txn)

    def _on_rows(self, ev: Any, kind: str) -> Iterator[LogItem]:
        table = f"{ev.schema}.{ev.table}"
        if table == self.watermark_table:
            self.in_txn = True
            if kind != DELETE:
                yield from self._watermarks(ev, kind)
        elif table in self.tables:
            self.in_txn = True
            try:
                held = self._hold_changes(table, ev, kind)
                self.unreadable.pop(table, None)
            except PartialImageError as e:
                held = yield from self._skip_rows(table, ev, str(e))
            except SchemaChangedError as e:
                if self.refresh is None:
                    raise
                held = yield from self._other_shape(table, ev, kind, e)
            # once per rows event, not per row: a stop only ever discards the open
            # (uncommitted) transaction, so checking here loses nothing
            if held and self.should_stop():
                self.stopped = True
            if len(self.txn) >= self.settings.stream_txn_after and not self.savepoints:
                out, self.txn = self.txn, []
                self.streamed += len(out)
                self.streamed_tables.update(e.table for e in out)
                yield from (RowChange(e) for e in out)

    def _watermarks(self, ev: Any, kind: str) -> Iterator[LogItem]:
        start = ev.packet.log_pos - ev.packet.event_size
        self.unreadable = dict.fromkeys(self.unreadable, False)
        for i, row in enumerate(ev.rows):
            values = row["after_values"] if kind == UPDATE else row["values"]
            if "value" not in values:
                raise SourceSetupError(
                    f"the binlog carries no column names for {self.watermark_table}: "
                    "SET GLOBAL binlog_row_metadata=FULL (and in the server config)")
            value = values["value"]
            if isinstance(value, bytes):
                value = value.decode("ascii")
            yield WatermarkSeen(str(value).strip(), Position(self.file_no, start, i))
            if self.should_stop():
                self.stopped = True
                return

    def _hold_changes(self, table: str, ev: Any, kind: str) -> bool:
        """The rows event's changes join the open transaction; False if it had no rows."""
        captured = self.tables[table]
        conv = self._converter(table, ev)
        check_binlog_key(captured.schema, ev.primary_key)
        if self.logged_shapes.get(table) is not ev.columns:   # a TABLE_MAP not checked yet
            problem = logged_shape_problem(captured, ev.columns)
            if problem:
                raise SchemaChangedError(f"the shape of {table} in the binlog is not the one read: {problem}")
            self.logged_shapes[table] = ev.columns
        images = self._images(conv, ev, kind)
        if not images:
            return False
        start = ev.packet.log_pos - ev.packet.event_size
        ts = int(ev.timestamp) * 1000
        txn, file_no = self.txn, self.file_no

        def change(kind: str, seq: int, key: tuple, before, after, why: str | None) -> None:
            txn.append(Event(table, kind, key, before, after, Position(file_no, start, seq), ts, why))

        seq = 0
        for before, after in images:   # each a converter's (row, key, why), or None
            if before is None:
                change(INSERT, seq, after[1], None, after[0], after[2])
            elif after is None:
                change(DELETE, seq, before[1], before[0], None, before[2] if conv.uncarried_key(before[1]) else None)
            elif before[1] == after[1]:
                change(UPDATE, seq, after[1], before[0], after[0], after[2])
            else:  # a primary-key change: the old key goes, the new one comes
                change(DELETE, seq, before[1], before[0], None, before[2] if conv.uncarried_key(before[1]) else None)
                seq += 1
                change(INSERT, seq, after[1], None, after[0], after[2])
            seq += 1
        self.captured_in_txn += seq
        return True

    def _converter(self, table: str, ev: Any) -> RowConverter:
        conv = self.converters.get(table)
        if conv is None:
            captured = self.tables[table]
            conv = self.converters[table] = self.converter_class(captured.schema, captured.native)
        return conv

    def _images(self, conv: RowConverter, ev: Any, kind: str) -> list[tuple]:
        """The event's (before, after) images, converted: mysql-replication's rows."""
        raw_text(ev.columns)   # text comes as bytes, decoded as the server does (rows.py)
        rows = ev.rows  # decodes every row image of the event
        if not rows:
            return []
        if not all(full_image(b, ev.number_of_columns) for b in (ev.columns_present_bitmap,
                                                                 getattr(ev, "columns_present_bitmap2", None)) if b):
            raise PartialImageError(partial_image_why(ev.schema, ev.table))
        fix_time = conv.fix_time(ev.columns, self.time2) if conv.has_time else NO_NAMES
        if kind == UPDATE:
            conv.check_names(rows, "before_values")
            conv.check_names(rows, "after_values")
            return [(conv.image(r["before_values"], r["before_none_sources"], fix_time),
                     conv.image(r["after_values"], r["after_none_sources"], fix_time)) for r in rows]
        conv.check_names(rows, "values")
        images = [conv.image(r["values"], r["none_sources"], fix_time) for r in rows]
        return [(None, i) for i in images] if kind == INSERT else [(i, None) for i in images]
