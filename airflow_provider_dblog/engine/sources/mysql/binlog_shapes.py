"""How the binlog reader meets a change of a captured table's shape: a statement that
altered, truncated or broke it (``_on_statement``), and rows that are not in the shape it
read (``_other_shape``), or that it cannot read at all (``_skip_rows``). A mixin of
BinlogReader (binlog.py), which holds the state these read and write."""
from __future__ import annotations

from typing import Any, Iterator

from ...errors import DBLogError, SchemaChangedError
from ...positions import Position
from ..base import LogItem, SchemaChange, TableBroken, TableTruncated
from .captured import catalog_past_statement
from .ddl import ALTERED, BROKEN, TRUNCATED, TableStatement


class ShapeHandlers:
    def _on_statement(self, st: TableStatement, pos: Position, ts: int) -> Iterator[LogItem]:
        """A statement's effect on one captured table (sources/mysql/ddl.py)."""
        if st.effect == TRUNCATED:
            yield TableTruncated(st.table, pos, ts)
            return
        if self.refresh is None:
            if st.effect == BROKEN:
                yield TableBroken(st.table, pos, st.why)
            return
        old = self.tables[st.table]
        try:   # the table's shape after the statement, from the catalog
            new = self.refresh(st.table)
        except DBLogError as e:   # gone (DROP, RENAME) or no key any more: rows of it fail check_names
            if st.effect == BROKEN:
                yield TableBroken(st.table, pos, st.why)
            else:
                self.unreadable[st.table] = True
                yield TableBroken(st.table, pos, f"its shape could not be read after an ALTER TABLE at binlog "
                                                 f"position {pos} ({e})")
            return
        past = catalog_past_statement(old, new, st) if st.effect == ALTERED else ""
        if past and self.replay is not None:   # computed by the server on a scratch copy (shape_replay.py)
            again = self.replay(st, old)
            if again is not None and not catalog_past_statement(old, again, st):
                new, past = again, ""
        self.tables[st.table] = new
        self.converters.pop(st.table, None)
        self.logged_shapes.pop(st.table, None)
        self.unreadable.pop(st.table, None)
        if st.effect == ALTERED or (new.schema, new.native) != (old.schema, old.native):
            # the version from here (a break: the shape its targets are rebuilt in)
            yield SchemaChange(st.table, pos, st.altered.renamed if st.altered and not past else (), not st.strict)
        if st.effect == BROKEN:
            yield TableBroken(st.table, pos, f"{st.why} at binlog position {pos}")
        elif past:
            yield TableBroken(st.table, pos, f"the catalog is already past the ALTER TABLE at binlog position "
                                             f"{pos} ({past}): the table was changed again since, and the "
                                             "shape it had here cannot be known")

    def _other_shape(self, table: str, ev: Any, kind: str, error: SchemaChangedError) -> Iterator[LogItem]:
        """A rows event whose columns are not the table's captured shape: the catalog is
        read again (a table dropped and created again: SchemaChange at the event, whose
        rows then match it). Rows that match no shape read (the catalog already past them)
        are skipped, the table broken at the first of them, until its rows match again.
        Returns whether the event's changes were taken."""
        pos = Position(self.file_no, ev.packet.log_pos - ev.packet.event_size, 0)
        if table in self.unreadable:   # broken again at its first skipped rows after each watermark: a
            if not self.unreadable[table]:   # dump that read it after the last break may still lack them
                self.unreadable[table] = True
                yield TableBroken(table, pos, f"rows of {table} at {pos} were skipped (they still are): re-dump it")
            return False
        old = self.tables[table]
        try:
            self.tables[table] = self.refresh(table)
        except DBLogError as e:   # gone again, or no key
            self.unreadable[table] = True
            yield TableBroken(table, pos, f"{error}; its shape could not be read again ({e})")
            return False
        self.converters.pop(table, None)
        self.logged_shapes.pop(table, None)
        if (self.tables[table].schema, self.tables[table].native) != (old.schema, old.native):
            yield SchemaChange(table, pos)
        try:
            return self._hold_changes(table, ev, kind)
        except SchemaChangedError as again:
            self.unreadable[table] = True
            yield TableBroken(table, pos, f"{again}: the catalog is already past these rows (changed again "
                                          "since); the table's rows are skipped until they match it")
            return False

    def _skip_rows(self, table: str, ev: Any, why: str) -> Iterator[LogItem]:
        """Rows no decoder can read exactly (a partial row image): skipped, the table broken
        at the first of them after each watermark. Returns that the event's changes were not taken."""
        pos = Position(self.file_no, ev.packet.log_pos - ev.packet.event_size, 0)
        if not self.unreadable.get(table):
            self.unreadable[table] = True
            yield TableBroken(table, pos, f"{why} (at binlog position {pos}): its rows are skipped until "
                                          "they can be read; re-dump it then")
        return False
