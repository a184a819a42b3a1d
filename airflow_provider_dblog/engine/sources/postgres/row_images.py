"""The row images of a captured table's changes: pgoutput tuples (text values) into
rows of logical values by the captured schema's converters (column_types.text_converter),
with their keys. An UPDATE or DELETE needs the full old row (REPLICA IDENTITY FULL);
an unchanged TOAST value is taken from it. A value no target can hold becomes None
and is named in the change's error.

Nothing here imports Airflow.
"""
from __future__ import annotations

import operator
from typing import Callable

from ...errors import DBLogError, SchemaChangedError, SourceSetupError, UncarriedValueError
from ...events import DELETE, INSERT, UPDATE
from .lsn import int_to_lsn
from .pgoutput_messages import Delete, Relation, Update

UNCARRIED_KEY = "!uncarried:"   # as in sources/mysql.py: a key value no target can hold


def tuple_text(rel: Relation, tup) -> dict[str, str | None]:
    """A tuple's raw texts by column name (the watermark row's)."""
    return {c.name: (None if raw is None else raw.decode("utf-8"))
            for c, (kind, raw) in zip(rel.columns, tup)}


def key_getter(schema) -> Callable[[dict], tuple]:
    """``schema.key_of`` as one C call (itemgetter): it runs for every row image."""
    if len(schema.key) == 1:
        name = schema.key[0]
        return lambda row: (row[name],)
    return operator.itemgetter(*schema.key)


def row_values(tup, rel: Relation, convs: list, old: dict | None, schema, commit_lsn: int,
               errs: list) -> dict:
    """One tuple's values, each parsed by its column's converter (column_types.text_converter);
    an unchanged TOAST value (kind 'u') is taken from ``old``, the full old row. A value
    no target can hold becomes None and is named in ``errs`` as (column, raw text, why)."""
    out = {}
    for col, conv, (kind, raw) in zip(rel.columns, convs, tup):
        try:
            if kind == "t":   # the common case first: a text value
                out[col.name] = conv(raw.decode("utf-8"))
                continue
        except UncarriedValueError as e:
            errs.append((col.name, raw.decode("utf-8"), str(e)))
            out[col.name] = None
            continue
        except (TypeError, ValueError) as e:
            raise SchemaChangedError(
                f"{schema.qualified}.{col.name}: {e}; the column's type changed (ALTER "
                "TABLE?): update the capture's schema and re-dump the table") from None
        if kind == "n":
            out[col.name] = None
        elif kind == "u":   # unchanged TOAST: not sent, take it from the old row
            if old is None:
                raise SchemaChangedError(
                    f"{schema.qualified}.{col.name}: an UPDATE at LSN {int_to_lsn(commit_lsn)} "
                    "kept a TOASTed value that the log does not carry and no full old row "
                    f"was logged: ALTER TABLE {schema.qualified} REPLICA IDENTITY FULL, "
                    "then re-dump the table")
            out[col.name] = old[col.name]
        else:
            raise DBLogError(f"pgoutput sent a value of kind {kind!r} (binary?); the tail "
                             "reads text values")
    return out


def keyed(schema, key_of, row: dict, errs: list) -> tuple[tuple, str | None, bool]:
    """(key, why, key_bad) of a row image: ``why`` names its values that could not be
    carried, and a key column among them is named by its raw text in the key."""
    if not errs:
        return key_of(row), None, False
    why = "; ".join(f"{schema.qualified}.{c}: {e}" for c, _, e in errs)
    bad = {c: raw for c, raw, _ in errs}
    key_bad = any(k in bad for k in schema.key)
    key = tuple(f"{UNCARRIED_KEY}{bad[k]!r}" if k in bad else row[k] for k in schema.key)
    return key, why, key_bad


def old_new(m, rel: Relation, convs: list, schema, key_of, commit_lsn: int) -> tuple:
    """(op, key, before, after, error) for an Update or Delete message: one, or a delete
    and an insert when the update changed the key. Both need the full old row."""
    if m.old is None:
        raise SourceSetupError(
            f"an {'UPDATE' if isinstance(m, Update) else 'DELETE'} of {schema.qualified} at LSN "
            f"{int_to_lsn(commit_lsn)} carries no full old row: ALTER TABLE {schema.qualified} "
            "REPLICA IDENTITY FULL, then re-dump the table")
    eb: list = []
    before = row_values(m.old, rel, convs, None, schema, commit_lsn, eb)
    kb, wb, kb_bad = keyed(schema, key_of, before, eb)
    if m.__class__ is Delete:
        return ((DELETE, kb, before, None, wb if kb_bad else None),)
    ea: list = []
    after = row_values(m.new, rel, convs, before, schema, commit_lsn, ea)
    ka, wa, _ = keyed(schema, key_of, after, ea)
    if kb == ka:
        return ((UPDATE, kb, before, after, wa),)
    return ((DELETE, kb, before, None, wb if kb_bad else None), (INSERT, ka, None, after, wa))
