"""A key held twice by a Delta current-state table (issue 28): found after a MERGE, collapsed.

A current-state table holds one row per key, but a writer behind the apply's back can add
a second row of a key. delta-rs's MERGE then updates (or deletes) **every** target row the
key matches, so a repair (a key-list or full dump) would never collapse them. The MERGE's
own metrics show it at no cost: without a duplicate, each batch row updates or inserts at
most one row (non-deletes) or deletes at most one (deletes), so more target rows touched
than that (:func:`touched_twice`) means some key matched twice. Only then
:func:`collapse` reads the keys the batch touched (their rows now carry a position at or
above the batch's start), keeps each key held more than once as one row, its newest
(``_dblog_pos``: invariant 1), and writes them in one further commit, a replace-where of
exactly those keys (the whole table when a key's type has no exact SQL literal, or the keys
are many) carrying the applied position the MERGE's commit carried: the position, and
every earlier version (time travel), are unchanged.

A crash between the MERGE's commit and the collapse's must not leave the key twice for
good (the replayed batch is below the applied position: no MERGE sees it again). So each
MERGE commit records what it staged (``dblog.merged``: rows, deletes, the batch's start)
and each collapse commit says so (``dblog.collapsed``): :func:`pending` reads the newest of
them from the table's log, with the MERGE's own metrics, before every apply of the table.
No Spark and no Airflow here.
"""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake

from .base import POS_COLUMN
from .delta_maintain import literal, quote_name

log = logging.getLogger(__name__)

MAX_KEYS = 1000   # keys named in one replace-where predicate; more: the table is rewritten whole
MERGED = "dblog.merged"        # a MERGE commit's "<rows staged>,<deletes>,<batch start or ''>"
COLLAPSED = "dblog.collapsed"  # a collapse commit's mark: the MERGEs before it are settled


def touched_twice(metrics: dict, staged: int, deletes: int) -> bool:
    """Whether a MERGE of ``staged`` rows (``deletes`` of them deletes) touched more target
    rows than it could with one row per key (a duplicate stale row can hide one: never a false alarm)."""
    get = lambda k: int(metrics.get(k, 0))  # noqa: E731
    return (get("num_target_rows_updated") + get("num_target_rows_inserted") > staged - deletes
            or get("num_target_rows_deleted") > deletes)


def merged(staged: int, deletes: int, since: str | None) -> dict[str, str]:
    """The commit metadata of a MERGE of ``staged`` rows (``deletes`` of them) from ``since``."""
    return {MERGED: f"{staged},{deletes},{since or ''}"}


def pending(dt: DeltaTable) -> tuple[bool, str | None]:
    """Whether the newest MERGE this module's marks name touched a key twice and no collapse
    followed it (a crash between the two commits), and that MERGE's batch start."""
    for commit in dt.history(64):   # newest first; older MERGEs were settled by the apply after them
        if COLLAPSED in commit:
            return False, None
        if MERGED in commit:
            staged, deletes, since = commit[MERGED].split(",", 2)
            twice = touched_twice(commit.get("operationMetrics") or {}, int(staged), int(deletes))
            return twice, since or None
    return False, None


def _newest(rows: pa.Table, key: list[str]) -> pa.Table:
    """One row per key: the one with the highest ``_dblog_pos``."""
    if rows.num_rows <= 1:
        return rows
    rows = rows.sort_by([(k, "ascending") for k in key] + [(POS_COLUMN, "descending")])
    n = rows.num_rows
    first = None
    for k in key:
        col = rows[k].combine_chunks()
        a, b = col.slice(1), col.slice(0, n - 1)
        differs = pc.not_equal(a, b)
        if pa.types.is_floating(col.type):   # a NaN key is one key (the source's, and GROUP BY's), though NaN != NaN
            differs = pc.and_(differs, pc.invert(pc.and_(pc.is_nan(a), pc.is_nan(b))))
        first = differs if first is None else pc.or_(first, differs)
    return rows.filter(pa.concat_arrays([pa.array([True]), first]))


def _where(keys: pa.Table, key: list[str]) -> str | None:
    """The SQL predicate naming exactly ``keys`` (their rows to replace), or None when a
    value has no exact literal (delta_maintain.literal) or the keys are too many."""
    if keys.num_rows > MAX_KEYS:
        return None
    out = []
    for row in keys.to_pylist():
        lits = [literal(row[k], keys.schema.field(k).type) for k in key]
        if any(v is None for v in lits):
            return None
        out.append("(" + " AND ".join(f"{quote_name(k)} = {v}" for k, v in zip(key, lits)) + ")")
    return " OR ".join(out)


def _query(dt: DeltaTable, sql: str) -> pa.Table:
    """``sql`` over the table as ``t``, run by delta-rs (the engine its write predicates use)."""
    return pa.table(QueryBuilder().register("t", dt).execute(sql).read_all())


def collapse(dt: DeltaTable, key: list[str], since: str | None, commit: CommitProperties,
             mark: bool = False) -> int:
    """Each key held more than once among the rows at or above position ``since`` (the
    batch's start; None: every row) kept as its newest row, in one commit with ``commit``'s
    properties (the applied position unchanged). Returns how many keys were collapsed.
    ``mark``: a pending MERGE settled (:func:`pending`) gets its collapse mark even when no
    key is held twice any more (an empty commit), so it is not looked at again."""
    commit = CommitProperties(custom_metadata={**(commit.custom_metadata or {}), COLLAPSED: "1"})
    schema = pa.schema(dt.schema().to_arrow())
    cols = ", ".join(quote_name(k) for k in key)
    above = "" if since is None else f" WHERE {quote_name(POS_COLUMN)} >= '{since.replace(chr(39), chr(39) * 2)}'"
    twice = _query(dt, f"SELECT {cols} FROM t{above} GROUP BY {cols} HAVING count(*) > 1")
    if not twice.num_rows:
        if mark:
            write_deltalake(dt, schema.empty_table(), mode="append", commit_properties=commit)
        return 0
    twice = twice.cast(pa.schema([schema.field(k) for k in key]))
    where = _where(twice, key)
    rows = _query(dt, "SELECT * FROM t" + (f" WHERE {where}" if where else "")).cast(schema)
    write_deltalake(dt, _newest(rows, key), mode="overwrite", predicate=where, commit_properties=commit)
    log.warning("Delta table %s: %d key(s) held twice (rows written behind the apply) collapsed to their newest "
                "row (%s)", dt.table_uri, twice.num_rows, "those keys rewritten" if where else "the table rewritten")
    return twice.num_rows
