"""Schema history by position: each captured table's schema versions, each holding from a
log position, and which changes between two versions can flow into the targets.

- The tail records a version (a source's ``describe_table``: the schema and what the log
  reader needs to decode rows) when it first captures a table, at its checkpoint, and at
  each schema change it reads in the log (MySQL/MariaDB: an ALTER TABLE query event;
  PostgreSQL: a Relation message that differs), before any event decoded with it. The
  store keeps them as ``schema-<position>.json`` next to the table's segments.
- A restarted tail decodes the log from its checkpoint with the version that held there,
  not with the catalog's (which may already be past a change still ahead in the log).
- An apply reads a batch with the version holding at its start; the batch ends at the
  next version that changes the table's shape, where the target takes the change
  (engine/schema_evolution.py: each behaviour, each kind of change).
- A dump chunk is reconciled only in the shape holding at its HW, and only when no change
  of its table lies inside its window (:func:`chunk_shape_problem`); else it is redone,
  selected again in the new shape.
- A change the targets cannot follow quarantines the table (engine/quarantine.py).

Nothing here imports Airflow.
"""
from __future__ import annotations

import json

from .positions import Position
from .schema import TableSchema


def as_stored(version: dict) -> dict:
    """A version as it reads back from the store (JSON: tuples are lists), so a version
    just described compares equal to the same one read back."""
    return json.loads(json.dumps(version, sort_keys=True))


DESCRIBED = ("schema", "native", "extra")   # what a source's describe_table gives; the tail adds the rest


def same_description(a: dict, b: dict) -> bool:
    """Two versions describe the same shape (what the source describes; not what the tail
    added: the behaviour, the renames, a quarantine)."""
    return all(a.get(k) == b.get(k) for k in DESCRIBED)


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
