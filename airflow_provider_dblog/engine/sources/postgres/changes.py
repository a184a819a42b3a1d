"""Transactions of the captured tables, assembled from decoded pgoutput messages.

- The stream arrives in commit order. A change's position is (0, commit LSN, index
  within the transaction): Begin carries the commit LSN (final_lsn), so positions are
  known as the changes arrive. A transaction ends (TxnEnd) at its Commit's end LSN,
  which is where a restart resumes: the server skips every transaction whose commit
  record starts before it.
- A transaction's row changes are given out at its Commit, or early, STREAM_TXN_AFTER at
  a time, so that a large transaction is never held whole (the tail writes it in parts;
  pgoutput v1 sends only committed transactions, so nothing given out is taken back).
- Except under a DEFERRABLE primary key, where two rows may share a key inside the
  transaction: such a table's changes are held to the Commit, and when a key was
  touched twice they go out as one final change per key (engine/netting.py). A large
  transaction on such a table is held whole (the README's known limits).
- A write of the watermark row is given out at once, as WatermarkSeen.
- A Relation message that differs from the captured schema is a schema change: the
  table's shape is read again from the catalog (it must then match the message), the
  transaction's changes so far are given out, and SchemaChange tells the tail that the
  table's rows are decoded with the new shape from the next change on.
- A TRUNCATE of a captured table is TableTruncated at its point of the transaction (the
  transaction's changes before it given out first; those held for netting dropped: the
  TRUNCATE removed their rows).
- A column's shape includes its type modifier (numeric(10,2) and numeric(12,3) share a type
  OID): a Relation message whose modifiers differ is a schema change too.
- A Relation that looks as recorded while the catalog gives one of its columns another
  attnum (dropped and added again under the same name, in one Relation or while the tail
  was stopped): the log cannot tell when, so the catalog's shape is given out as a change,
  which quarantines the table (engine/schema_evolution.py: ``recreated``).
- The table behind a captured name is known by its oid: a Relation of that oid under
  another name (renamed away) breaks the table there and its rows are skipped from then
  on; a table of another oid under the name (created again; also found between
  transactions, ``catalog_check``) is added to the publication and given out as a change,
  whose version records the new oid (engine/tail_shapes.py quarantines the table and
  requests its full dump).
- A Relation message that the catalog read again does not match (the table changed
  again since: two ALTERs while the tail was behind) breaks the table there
  (TableBroken: its targets stop until a re-dump), gives out the catalog's shape
  (SchemaChange, the shape its rows have once they match it again), and its changes are
  skipped until a Relation matches (row_images.py refuses what a change itself lacks).

Nothing here imports Airflow.
"""
from __future__ import annotations

from typing import Callable, Iterator

import psycopg2.errors

from ...errors import DBLogError, SchemaChangedError, UnknownTableError
from ...events import INSERT, Event
from ...netting import needs_netting, net_changes
from ...positions import Position
from ...schema import TableSchema
from ..base import LogItem, RowChange, SchemaChange, TableBroken, TableTruncated, TxnEnd, WatermarkSeen
from .column_types import NativeColumn, text_converter
from .log_marks import LogMarks
from .lsn import int_to_lsn
from .pgoutput_messages import (Begin, Commit, Delete, Insert, Message, Relation, StreamAbort, StreamCommit,
                                StreamStart, StreamStop, Truncate, Update)
from .row_images import key_getter, keyed, old_new, row_values, tuple_text

STREAM_TXN_AFTER = 10_000   # a transaction's changes held before they are given out early


def relation_problem(rel: Relation, schema: TableSchema, native: dict[str, NativeColumn]) -> str:
    """How a Relation message's columns or types differ from ``schema``'s ("" if they do not)."""
    names = [c.name for c in rel.columns]
    if names != schema.column_names:
        return f"the log has columns {names}, the captured schema {schema.column_names}"
    changed = [c.name for c in rel.columns
               if (native[c.name].att_type_oid and c.type_oid != native[c.name].att_type_oid)
               or (native[c.name].typmod is not None and c.atttypmod != native[c.name].typmod)]
    return f"the type of {', '.join(changed)} changed" if changed else ""


def check_relation(rel: Relation, schema: TableSchema, native: dict[str, NativeColumn]) -> None:
    """SchemaChangedError if a Relation message's columns or types differ from ``schema``'s."""
    problem = relation_problem(rel, schema, native)
    if problem:
        raise SchemaChangedError(
            f"{schema.qualified} changed (ALTER TABLE?): {problem}; re-dump the table "
            "(`dblog reset` of the source if the tail cannot go on)")


class TransactionAssembler(LogMarks):
    """The open transaction of the stream, fed one decoded message at a time."""

    def __init__(self, schemas: dict[str, TableSchema], natives: dict[str, dict[str, NativeColumn]],
                 watermark_table: str, deferrable: set[str] = frozenset(),
                 stream_after: int = STREAM_TXN_AFTER,
                 refresh: Callable[[str], tuple[TableSchema, dict[str, NativeColumn]]] | None = None,
                 catalog=None):
        """``refresh(table)``: the table's (schema, native columns) read again from the catalog;
        ``catalog``: the source (``table_oid``, ``catalog_identity``, ``publish``), or None."""
        self.schemas = schemas
        self.catalog = catalog
        # the oid of the table each captured name is read as (0: not known)
        self.oids: dict[str, int] = {t: catalog.table_oid(t) for t in schemas} if catalog else {}
        self.refresh = refresh
        self.natives = natives
        self.watermark_table = watermark_table
        self.deferrable = deferrable        # tables whose primary key is DEFERRABLE
        self.stream_after = stream_after
        # relation oid -> (captured table, its schema, Relation, column converters, key getter)
        self.relations: dict[int, tuple] = {}
        self.unreadable: set[str] = set()   # tables whose Relation matches no shape read: skipped
        self.identity_broken: set[str] = set()   # tables whose REPLICA IDENTITY is not FULL: skipped
        self.in_txn = False
        self.commit_lsn = self.seq = self.ts = 0
        # the open transaction's row changes not yet given out; those of tables with a
        # DEFERRABLE key, the keys they touched, and whether one was touched twice
        self.txn: list[Event] = []
        self.held: list[Event] = []
        self.touched: set = set()
        self.shared = False
        self._marks_init()   # log_marks.py: deferrability, partition roots, watermark shapes

    def change(self, m: Insert | Update | Delete) -> WatermarkSeen | TableBroken | list | None:
        """An Insert, Update or Delete: its row changes join the transaction; a
        watermark write, or a skipped change that breaks its table, is returned."""
        entry = self.relations.get(m.relation_oid)
        if entry is None:
            return None   # a table we do not capture (a shared publication)
        table, schema, rel, convs, key_of = entry
        commit_lsn = self.commit_lsn
        if table == self.watermark_table:
            if m.__class__ is Delete:
                return None
            value = tuple_text(rel, m.new).get("value") or ""
            pos = Position(0, commit_lsn, self.seq)
            self.seq += 1
            self.skip_marked.clear()   # a change skipped after a watermark breaks again (log_marks.py)
            return WatermarkSeen(value.strip(), pos)
        if schema is None:   # skipped (the table is broken there; again after a watermark)
            return self.skipped(table, m.relation_oid)
        if m.__class__ is Insert:
            errs: list = []
            after = row_values(m.new, rel, convs, None, schema, commit_lsn, errs)
            key, why, _ = keyed(schema, key_of, after, errs)
            changes: tuple = ((INSERT, key, None, after, why),)
        else:
            changes = old_new(m, rel, convs, schema, key_of, commit_lsn)
        held = table in self.deferrable
        out = self.held if held else self.txn
        for op, key, before, after, why in changes:
            out.append(Event(table, op, key, before, after,
                             Position(0, commit_lsn, self.seq), self.ts, why))
            if held:
                self.shared = self.shared or needs_netting(self.touched, table, key)
            self.seq += 1
        return None

    def early(self) -> Iterator[RowChange]:
        """The open transaction's changes so far (but those held for netting), once it
        holds ``stream_after``: it is never held whole."""
        if len(self.txn) >= self.stream_after:
            out, self.txn = self.txn, []
            for e in out:
                yield RowChange(e)

    def begin(self, m: Begin) -> None:
        self.in_txn, self.commit_lsn, self.seq, self.xid = True, m.final_lsn, 0, m.xid
        self.ts = int(m.commit_ts.timestamp() * 1000)
        self.txn, self.held, self.touched, self.shared = [], [], set(), False

    def commit(self, m: Commit) -> Iterator[LogItem]:
        """The transaction's row changes, those held netted if a key was touched twice,
        then its TxnEnd."""
        if not self.in_txn or m.commit_lsn != self.commit_lsn:
            raise DBLogError(f"pgoutput Commit at {int_to_lsn(m.commit_lsn)} does not "
                             "match its Begin; restart from the last checkpoint")
        self.in_txn = False
        txn, held, self.txn, self.held = self.txn, self.held, [], []
        for e in txn:
            yield RowChange(e)
        if self.shared:
            # numbered past every position of the transaction: some may be written already
            for i, e in enumerate(net_changes(held)):
                yield RowChange(e._replace(pos=Position(0, self.commit_lsn, self.seq + i)))
        else:
            for e in held:
                yield RowChange(e)
        yield TxnEnd(Position(0, m.end_lsn, 0), {"lsn": int_to_lsn(m.end_lsn)})

    def relation(self, m: Relation) -> Iterator[LogItem]:
        """A captured table's Relation (checked against its schema, its column converters
        built once per message; one that differs is a schema change); another table's is
        ignored."""
        table = f"{m.namespace}.{m.name}"
        if self.catalog is not None:
            gone = self._renamed_away(m, table)
            if gone is not None:
                yield from gone
                return
        if table in self.schemas:
            schema, native = self.schemas[table], self.natives[table]
            if self.catalog is not None:
                expected = self.oids.get(table)
                if expected and m.oid != expected:
                    yield from self._other_table(table, m)
                    return
                if not relation_problem(m, schema, native) and self._recreated_columns(table, native):
                    yield from self._schema_change(table, m)
                    schema, native = self.schemas[table], self.natives[table]
            if relation_problem(m, schema, native) and self.refresh is not None:
                yield from self._schema_change(table, m)
                if table in self.unreadable:
                    self.relations[m.oid] = (table, None, m, [], None)
                    return
                schema, native = self.schemas[table], self.natives[table]
            check_relation(m, schema, native)
            if m.replica_identity != "f":   # its UPDATEs and DELETEs lack the old row: only it stops
                yield from self._identity_not_full(table, m)
                return
            self.unreadable.discard(table)
            self.identity_broken.discard(table)
            convs = [text_converter(native[c.name]) for c in m.columns]
            self.relations[m.oid] = (table, schema, m, convs, key_getter(schema))
            yield from self.deferrability(table)
        elif table == self.watermark_table:
            self.relations[m.oid] = (table, None, m, [], None)
        elif table in self.roots:
            yield from self.root_relation(table, m)

    # -- a table or column re-created under the same name (its identity: oid, attnum) --------
    def _pos(self) -> Position:
        return Position(0, self.commit_lsn, self.seq)

    def _renamed_away(self, m: Relation, name: str) -> Iterator[LogItem] | None:
        """A captured table's oid under another name: renamed away. Its rows are not the
        captured table's from here (skipped); the table breaks here, and one created again
        under the name is captured from here (:meth:`_recreated`)."""
        entry = self.relations.get(m.oid)
        was = entry[0] if entry is not None and entry[0] in self.schemas else None
        was = was or next((t for t, o in self.oids.items() if o == m.oid), None)
        if was is None or was == name:
            return None
        if entry is not None and entry[1] is None:   # known to be skipped: sent again (an invalidation)
            self.relations[m.oid] = (was, None, m, [], None)
            return iter(())

        def items() -> Iterator[LogItem]:
            self.relations[m.oid] = (was, None, m, [], None)   # its rows: skipped
            self.oids[was] = -1                                # renamed away: no table is it now
            yield from self._flush_table(was)
            yield TableBroken(was, self._pos(), f"{was} was renamed to {name} at {self._pos()}: its rows there are "
                                                "not captured any more; a table created again under the name is "
                                                "re-created: captured from where the tail finds it, with a full "
                                                "dump requested")
            yield from self.catalog_check([was], self._pos())
        return items()

    def _other_table(self, table: str, m: Relation) -> Iterator[LogItem]:
        """A Relation of another oid than the captured table's under its name: an older
        table (renamed away since: the catalog still has the captured oid) is skipped; a
        newer one is the table re-created."""
        now, _ = self.catalog.catalog_identity(table)
        if now == self.oids.get(table):
            self.relations[m.oid] = (table, None, m, [], None)
            return
        self.relations[m.oid] = (table, None, m, [], None)   # until read as the new table below
        yield from self._recreated(table, self._pos())
        if self.oids.get(table) == m.oid:
            yield from self.relation(m)

    def _recreated_columns(self, table: str, native: dict[str, NativeColumn]) -> list[str]:
        """The captured columns the catalog now gives another attnum (dropped and added again)."""
        recorded = {n: c.attnum for n, c in native.items() if c.attnum}
        if not recorded:
            return []
        oid, attnums = self.catalog.catalog_identity(table)
        if oid != self.oids.get(table):
            return []
        return [n for n, a in recorded.items() if n in attnums and attnums[n] != a]

    def _flush_table(self, table: str) -> Iterator[LogItem]:
        out, self.txn = self.txn, []
        for e in out:
            yield RowChange(e)

    def _recreated(self, table: str, pos: Position) -> Iterator[LogItem]:
        """The captured name holds another table now: it is put into the publication, read
        again and given out as a change at ``pos`` (its version records the new oid, which
        quarantines it and requests its dump: engine/tail_shapes.py). The old table's rows
        are skipped from here (they are not the table's)."""
        old = self.oids.get(table)
        yield from self._flush_table(table)
        try:
            self.catalog.publish(table)
            self.schemas[table], self.natives[table] = self.refresh(table)
        except (UnknownTableError, psycopg2.errors.UndefinedTable):   # dropped again meanwhile: a later check
            return
        self.oids[table] = self.catalog.table_oid(table)
        for oid, entry in list(self.relations.items()):
            if entry[0] == table and oid != self.oids[table]:
                self.relations[oid] = (table, None, entry[2], [], None)
        self.unreadable.discard(table)
        yield TableBroken(table, pos, f"{table} was re-created at or before {pos} (another table under the name: "
                                      f"oid {old if old and old > 0 else 'renamed away'} -> {self.oids[table]}); "
                                      "the log cannot carry the rows it held")
        yield SchemaChange(table, pos)

    def catalog_check(self, tables, pos: Position) -> Iterator[LogItem]:
        """Between transactions (and after a rename away): a captured name whose oid in the
        catalog is not the one read is re-created (its rows are not in the log before it is
        published)."""
        if self.catalog is None:
            return
        watched = [t for t in tables if self.oids.get(t)]
        oids = self.catalog.catalog_oids(watched) if watched else {}
        for table in watched:
            now = oids.get(table)
            if now is not None and now != self.oids.get(table):
                yield from self._recreated(table, pos)

    def _schema_change(self, table: str, m: Relation) -> Iterator[LogItem]:
        """The table's shape read again; the transaction's changes so far given out first
        (they were decoded with the old one), then SchemaChange at the next change. A
        catalog that does not match the message (changed again since) breaks the table
        there (TableBroken, once) and the catalog's shape is given out if it is new."""
        if any(e.table == table for e in self.held):
            raise SchemaChangedError(
                f"{table} changed (ALTER TABLE) inside a transaction that had changed its rows, under "
                "a DEFERRABLE key (held for netting): re-dump the table")
        yield from self._flush_table(table)
        old = self.schemas[table], self.natives[table]
        try:
            self.schemas[table], self.natives[table] = self.refresh(table)
        except DBLogError as e:   # dropped, renamed, keyless since this point: the catalog is past it
            if table not in self.unreadable:
                self.skipping(self.unreadable, table)
                yield TableBroken(table, self._pos(), f"{table} changed here and its shape cannot be read from the "
                                                      f"catalog since ({e}); its changes are skipped until it can")
            return
        if self.catalog is not None:   # a new oid is recorded with the version (re-created: quarantined)
            self.oids[table] = self.catalog.table_oid(table)
        problem = relation_problem(m, self.schemas[table], self.natives[table])
        if problem and self.catalog is not None and self.catalog.retype_as_logged(table, m.columns):
            # only a later ALTER ... TYPE within the type: the message's modifiers are the rows'
            self.schemas[table], self.natives[table] = (self.catalog.table_schema(table),
                                                        self.catalog.native_columns(table))
            problem = ""
        if problem and table not in self.unreadable:
            self.skipping(self.unreadable, table)
            yield TableBroken(table, self._pos(), f"{table} changed again since this point of the log (the catalog "
                                                  f"is past it): {problem}; its changes are skipped until they "
                                                  "match the catalog")
        if problem and (self.schemas[table], self.natives[table]) == old:
            return
        if not problem:
            self.unreadable.discard(table)
        yield SchemaChange(table, self._pos())

    def _identity_not_full(self, table: str, m: Relation) -> Iterator[LogItem]:
        """A captured table whose REPLICA IDENTITY is no longer FULL: its changes are skipped
        from here (the table breaks once) until a Relation shows FULL again; a re-dump then
        releases it."""
        self.relations[m.oid] = (table, None, m, [], None)
        if table in self.identity_broken:
            return
        self.skipping(self.identity_broken, table)
        ident = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}.get(m.replica_identity, m.replica_identity)
        yield TableBroken(table, Position(0, self.commit_lsn, self.seq),
                          f"{table}'s REPLICA IDENTITY is now {ident}, not FULL: its UPDATEs and DELETEs no longer "
                          f"carry the old row, so its changes are skipped from here. ALTER TABLE {table} REPLICA "
                          "IDENTITY FULL, then re-dump the table")

    def truncate(self, m: Truncate) -> Iterator[LogItem]:
        """A TRUNCATE of captured tables: each is emptied at this point of the transaction.
        Its changes held for netting (a DEFERRABLE key) are dropped: they would be numbered
        past the TRUNCATE at the commit, and their rows are gone."""
        hit = [self.relations[o][0] for o in m.relation_oids
               if o in self.relations and self.relations[o][0] in self.schemas]
        if not hit:
            return
        out, self.txn = self.txn, []
        for e in out:
            yield RowChange(e)
        self.held = [e for e in self.held if e.table not in hit]
        self.touched = {t for t in self.touched if t[0] not in hit} if self.touched else self.touched
        for table in hit:
            yield TableTruncated(table, Position(0, self.commit_lsn, self.seq), self.ts)
        self.seq += 1

    def other(self, m) -> Iterator[LogItem]:
        """Begin, Relation, Truncate, a watermark's Message; a streamed transaction is
        refused; Origin, Type and other Messages hold nothing to capture."""
        cls = m.__class__
        if cls is Begin:
            self.begin(m)
            yield from self.at_begin()
        elif cls is Message:
            yield from self.shapes(m)
        elif cls is Relation:
            yield from self.relation(m)
        elif cls is Truncate:
            yield from self.truncate(m)
        elif cls in (StreamStart, StreamStop, StreamCommit, StreamAbort):
            raise DBLogError("pgoutput sent a streamed transaction, which protocol "
                             "version 1 does not use")
