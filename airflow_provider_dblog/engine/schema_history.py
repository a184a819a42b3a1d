"""Schema history by position: each captured table's schema versions, each holding from a
log position, and which changes between two versions can flow into the targets.

- The tail records a version (a source's ``describe_table``: the schema and what the log
  reader needs to decode rows) when it first captures a table, at its checkpoint, and at
  each schema change it reads in the log (MySQL/MariaDB: an ALTER TABLE query event;
  PostgreSQL: a Relation message that differs), before any event decoded with it. The
  store keeps them as ``schema-<position>.json`` next to the table's segments.
- A restarted tail decodes the log from its checkpoint with the version that held there,
  not with the catalog's (which may already be past a change still ahead in the log).
- An apply takes the version that holds at its batch's end: the target gets that shape.
  Older segments read under it give an added column's null (pyarrow and Spark fill a
  struct field a file lacks).
- A dump chunk is reconciled only in the shape holding at its HW, and only when no change
  of its table lies inside its window (:func:`chunk_shape_problem`); else it is redone,
  selected again in the new shape.
- :func:`classify` says whether a change can flow: today, columns added that are
  nullable and have no default (every existing row holds null: no backfill), and changes
  that leave the logical schema as it was (a wider VARCHAR, an index, a comment). Any
  other change stops the tail with SchemaChangedError naming it (fail closed).

Nothing here imports Airflow.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .positions import Position
from .schema import TableSchema


@dataclass(frozen=True)
class SchemaDiff:
    added: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()   # why the change cannot flow, if it cannot

    @property
    def compatible(self) -> bool:
        return not self.problems

    @property
    def changed(self) -> bool:
        return bool(self.added or self.problems)

    def describe(self) -> str:
        parts = [f"added {', '.join(self.added)}"] if self.added else []
        return "; ".join(parts + list(self.problems)) or "no change to its columns"


def classify(old: TableSchema, new: TableSchema, defaults: dict[str, object] | None = None) -> SchemaDiff:
    """What changed from ``old`` to ``new`` and whether it can flow into the targets.
    ``defaults``: the new columns' defaults as the source reports them (None or absent:
    no default), since a default would give existing rows a value no event carries."""
    defaults = defaults or {}
    problems: list[str] = []
    old_cols = {c.name: c for c in old.columns}
    new_cols = {c.name: c for c in new.columns}
    if old.key != new.key:
        problems.append(f"the primary key changed from ({', '.join(old.key)}) to ({', '.join(new.key)})")
    dropped = [n for n in old_cols if n not in new_cols]
    if dropped:
        problems.append(f"column(s) {', '.join(dropped)} dropped or renamed")
    for n, c in old_cols.items():
        if n in new_cols and new_cols[n].type != c.type:
            problems.append(f"column {n} changed type from {c.type} to {new_cols[n].type}")
    added = [n for n in new_cols if n not in old_cols]
    for n in added:
        c = new_cols[n]
        if not c.nullable:
            problems.append(f"column {n} was added NOT NULL (existing rows hold a value no row event carries)")
        elif defaults.get(n) is not None:
            problems.append(f"column {n} was added with a default ({defaults[n]}): existing rows hold it, "
                            "and no row event carries it")
    if [n for n in new.column_names if n in old_cols] != [n for n in old.column_names if n in new_cols]:
        problems.append("columns were reordered")
    return SchemaDiff(tuple(added), tuple(problems))


def as_stored(version: dict) -> dict:
    """A version as it reads back from the store (JSON: tuples are lists), so a version
    just described compares equal to the same one read back."""
    return json.loads(json.dumps(version, sort_keys=True))


def version_at(versions: list[tuple[Position, dict]], pos: Position, inclusive: bool = True) -> dict | None:
    """The version holding at ``pos`` (the latest from at or before it; with
    ``inclusive=False``, from before it), or None when none is that old."""
    found = None
    for at, version in versions:
        if at < pos or (inclusive and at == pos):
            found = version
        else:
            break
    return found


def chunk_shape_problem(versions: list[tuple[Position, dict]], schema: TableSchema,
                        lw: Position, hw: Position) -> str | None:
    """Why a chunk selected as ``schema`` between ``lw`` and ``hw`` cannot be reconciled
    (its rows may be in another shape than its snapshot position's), or None."""
    holding = [(at, v) for at, v in versions if at <= hw]
    if not holding:
        return None
    at, version = holding[-1]
    if at > lw:
        return f"{schema.qualified} changed shape at {at}, inside the chunk's window ({lw}, {hw})"
    if TableSchema.from_dict(version["schema"]) != schema:
        return (f"{schema.qualified} was selected as {schema.column_names}, but holds "
                f"{[c[0] for c in version['schema']['columns']]} at the HW {hw}")
    return None
