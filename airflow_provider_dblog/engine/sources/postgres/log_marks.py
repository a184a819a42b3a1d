"""What the pgoutput stream does not say by itself, learned where it is exact (issue 27's
review items); a mixin of changes.py's TransactionAssembler.

- A primary key made DEFERRABLE (PostgreSQL drops and adds the key again: the Relation
  message is sent again, the same): at each captured table's Relation the catalog is read.
  Deferrable: its changes are held and netted from there (the ALTER committed before this
  change did). Not deferrable any more: the catalog is past some point of the log, so the
  table stays held until the transactions that commit after the catalog read (its WAL end,
  read in the same statement). Each switch is a SchemaChange: the version records it.
- A Relation of an ancestor of captured partitions: the publication publishes them via the
  root (publish_via_partition_root), their changes come as the root's: they break there.
- A watermark's logical message (watermarks.py) carries the captured tables' shapes at its
  position (the tables locked against ALTER meanwhile): a shape that differs from the one
  read (an ALTER with no row written since: no Relation yet) and equals the catalog's is a
  SchemaChange there, so a chunk selected after it is in the log's shape at its HW.
- An event trigger's logical message (ddl_marks.py) marks an ALTER TABLE / ALTER TYPE
  at its place: a captured table whose values it rewrote with no row change (an enum
  label renamed, TYPE ... USING) breaks there; one whose primary key it moved (no
  Relation shows a key under REPLICA IDENTITY FULL) changes shape there.
- A captured table whose changes are skipped (REPLICA IDENTITY not FULL, or its Relation
  matching no shape read) broke once where the skipping began; its first skipped change
  after each watermark breaks it again. A full dump releases a quarantine only when it
  read the table after the latest break (quarantine.py), and it reads its head before
  writing its first LW: a change skipped after that read (and after the LW) is a break
  after it, so the dump releases nothing past a change it may not hold. (Without it, a
  dump after the first break released the table, and every change skipped after the dump
  was lost with the table 'applied'.) One break per watermark, not per change.

Nothing here imports Airflow.
"""
from __future__ import annotations

import json
from typing import Iterator

from ...errors import DBLogError
from ..base import LogItem, SchemaChange, TableBroken
from .ddl_marks import DDL_PREFIX, rewrites
from .lsn import lsn_to_int
from .pgoutput_messages import Message

SHAPES_PREFIX = "dblog-shapes"


def same_shape(carried: dict, schema, native) -> bool:
    """The shape a watermark carried (catalog.SHAPES_SQL) is the one read; a field a
    version did not record (0 / None) is not compared."""
    cols = carried.get("cols") or []
    if [c[0] for c in cols] != list(schema.column_names) or (carried.get("key") or []) != list(schema.key):
        return False
    for name, typid, typmod, attnum, notnull in cols:
        n = native[name]
        if ((n.att_type_oid and n.att_type_oid != typid) or (n.typmod is not None and n.typmod != typmod)
                or (n.attnum and n.attnum != attnum) or schema.column(name).nullable == bool(notnull)):
            return False
    return True


class LogMarks:
    """The assembler's catalog-backed checks (self: a TransactionAssembler)."""

    def _marks_init(self) -> None:
        self.deferrable = set(self.deferrable)
        self.undefer: dict[str, int] = {}   # table -> the commit LSN from which it is not held
        self.roots = self.catalog.partition_roots() if self.catalog is not None else {}
        self.via_root: set[str] = set()     # partitions broken by a Relation of their root
        self.skip_marked: set[str] = set()  # skipped tables broken again since the last watermark

    def deferrability(self, table: str) -> Iterator[LogItem]:
        """At a captured table's Relation: its key's deferrability as the catalog says."""
        if self.catalog is None:
            return
        now, lsn = self.catalog.key_deferrable_now(table)
        if now:
            self.undefer.pop(table, None)
            if table not in self.deferrable:
                self.deferrable.add(table)
                self.catalog.set_key_deferrable(table, True)
                yield SchemaChange(table, self._pos())
        elif table in self.deferrable and table not in self.undefer:
            self.undefer[table] = lsn_to_int(lsn)

    def at_begin(self) -> Iterator[LogItem]:
        """A transaction committed after the catalog said a key is not deferrable any more."""
        for table, lsn in list(self.undefer.items()):
            if self.commit_lsn >= lsn:
                del self.undefer[table]
                self.deferrable.discard(table)
                self.catalog.set_key_deferrable(table, False)
                yield SchemaChange(table, self._pos())

    def skipping(self, kind: set, table: str) -> None:
        """``table``'s changes are skipped from its break here (``kind``: why)."""
        kind.add(table)
        self.skip_marked.add(table)

    def skipped(self, table: str, oid: int) -> TableBroken | list | None:
        """A change of ``table`` (relation ``oid``) that is skipped: a break when the table
        itself (its captured oid) has its changes skipped and has not broken since the last
        watermark. (The rows of a table renamed away or replaced are not the table's.) A
        change of a root its partitions are published through may be any of theirs: each
        breaks again (a list)."""
        if table in self.roots:
            parts = [p for p in self.roots[table] if p in self.via_root and p not in self.skip_marked]
            self.skip_marked.update(parts)
            return [TableBroken(p, self._pos(), f"a change of {table} at {self._pos()}, perhaps one of {p}'s, was "
                                                "skipped (it is published via the root): re-dump the table after it")
                    for p in parts] or None
        if (table in self.skip_marked or not oid or self.oids.get(table) != oid
                or (table not in self.identity_broken and table not in self.unreadable)):
            return None
        self.skip_marked.add(table)
        pos = self._pos()
        return TableBroken(table, pos, f"a change of {table} at {pos} was skipped (its changes still are): "
                                       "re-dump the table after it")

    def root_relation(self, root: str, m) -> Iterator[LogItem]:
        self.relations[m.oid] = (root, None, m, [], None)   # its changes: skipped (``skipped``)
        for part in self.roots.get(root, ()):
            if part in self.via_root:
                continue
            self.via_root.add(part)
            self.skip_marked.add(part)
            yield from self._flush_table(part)
            yield TableBroken(part, self._pos(), (
                f"the publication sends the changes of {part} as its partitioned table {root}'s "
                f"(publish_via_partition_root = true) from {self._pos()}: they are not captured. Fix: ALTER "
                "PUBLICATION <publication> SET (publish_via_partition_root = false), then re-dump the table"))

    def ddl_mark(self, m: Message) -> Iterator[LogItem]:
        """An ALTER TABLE / ALTER TYPE the event trigger marked (ddl_marks.py): each captured
        table whose values it rewrote with no row change breaks here."""
        carried = json.loads(m.content.decode("utf-8"))
        oids = set(carried.get("tables") or ())
        for table in [t for t in self.schemas if self.oids.get(t) in oids]:
            why = rewrites(carried, table)
            if why:
                yield from self._flush_table(table)
                yield TableBroken(table, self._pos(), f"{table} at {self._pos()}: {why}. Re-dump the table")
                self.seq += 1
            elif carried.get("tag") == "ALTER TABLE":
                yield from self.key_moved(table)

    def key_moved(self, table: str) -> Iterator[LogItem]:
        """An ALTER TABLE marked here that moved the table's primary key: under REPLICA
        IDENTITY FULL every Relation flags every column, so none shows it. The shape read
        here (the catalog once the DDL is visible) is a SchemaChange when its key differs; the
        version's evolution quarantines the table (a change of key)."""
        if self.refresh is None or table in self.unreadable:
            return
        before = self.catalog.describe_table(table)
        try:
            schema, native = self.refresh(table)
        except DBLogError:   # keyless or gone: the next Relation or watermark breaks it
            self.catalog.adopt_table(table, before)
            return
        if schema.key == self.schemas[table].key:
            self.catalog.adopt_table(table, before)
            return
        yield from self._flush_table(table)
        self.schemas[table], self.natives[table] = schema, native
        yield SchemaChange(table, self._pos())
        self.seq += 1

    def shapes(self, m: Message) -> Iterator[LogItem]:
        """A watermark's shapes: a table whose shape differs from the one read, and whose
        catalog is that shape still, changed at this point of the log. (A DDL mark: ddl_mark.)"""
        if m.prefix == DDL_PREFIX and m.flags & 1 and self.catalog is not None:
            yield from self.ddl_mark(m)
        if m.prefix != SHAPES_PREFIX or not m.flags & 1 or self.catalog is None:
            return
        for table, carried in json.loads(m.content.decode("utf-8")).items():
            if table in self.schemas and self.oids.get(table) not in (0, None, carried.get("oid")):
                # another table under the name (dropped or renamed away, and created again):
                # it is not published yet, so no Relation would ever say so
                yield from self.catalog_check([table], self._pos())
                continue
            if (table not in self.schemas or table in self.unreadable
                    or same_shape(carried, self.schemas[table], self.natives[table])):
                continue
            before = self.catalog.describe_table(table)
            try:
                schema, native = self.refresh(table)
            except DBLogError as e:   # keyless (or gone) since: this table breaks, the tail goes on
                yield from self._flush_table(table)
                self.skipping(self.unreadable, table)
                yield TableBroken(table, self._pos(), f"{table} changed at {self._pos()} and its shape cannot be "
                                                      f"read from the catalog since ({e}); its changes are skipped "
                                                      "until it can")
                self.seq += 1
                continue
            if not same_shape(carried, schema, native):   # changed again since: the next watermark tells
                self.catalog.adopt_table(table, before)
                continue
            yield from self._flush_table(table)
            self.schemas[table], self.natives[table] = schema, native
            yield SchemaChange(table, self._pos())
            self.seq += 1
