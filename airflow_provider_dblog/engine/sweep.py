"""The orphan sweep: a full-table dump also deletes target rows whose key the source no longer has.

Snapshot events only ever write rows, so a target row that the source lost while the log
was not captured (or that someone put into the target) would outlive a repair dump. A
finished full-table dump proves which rows are orphans:

* ``below``: the source's log head, read just before the dump read the table's max key;
* ``until``: the first position after the dump's last window (its last HW transaction),
  and, when the dump ended on a read that found no more rows (an empty table's max key,
  or rows up to the max key deleted meanwhile), the log head read just after it;
* ``keep``: the keys of every snapshot event of the table between ``below`` and ``until``.

Once every event below ``until`` is applied to a target, a target row with
``_dblog_pos < below`` whose key is not in ``keep`` is an orphan, and is deleted.

Why this is exact. Take such a row, key ``k``, written by the event at ``p < below``.
Every event below ``until`` is applied and the target keeps each key's newest, so the log
has no event of ``k`` in ``(p, until)``: in the source, ``k`` held that row from ``p`` on,
unchanged, through every read of the dump: the max-key read (so ``k <= max key``), each
chunk's select, and a final read that found no more rows (so ``k`` is not past the last
chunk). Hence the chunk whose range holds ``k`` read it, and no event of ``k`` fell in its
window, so the reconciler kept it: ``k`` is in ``keep``. A row outside ``keep`` is not in
the source at the apply's position (not even for a moment: a row about to be deleted by
a later event is in ``keep`` too), and nothing newer than the dump can be deleted: rows
written after ``below`` have ``_dblog_pos >= below``. (It relies on what Algorithm 1 relies on: what the
log orders before a point is visible to a statement that starts after it.)

The proof takes "what the log orders before a point is visible to a read after it"; a
PostgreSQL commit is logged before it becomes visible (a synchronous standby's
acknowledgement can sit between the two), so a row committed just before ``below`` can
be missed by the max-key read. Each candidate is therefore looked up in the source (by
key, bound parameters) before it is deleted, and kept if the source has it: the sweep
deletes only rows that are gone (``keys_in_source``; tests/integration/test_orphan_sweep.py
makes the gap last with a standby that never answers).

Only ``table`` and ``all`` dumps sweep (a key-list dump deletes its missing keys itself).
One sweep per table is kept, the newest dump's: it deletes everything an older one would.

A target that keeps a changelog (targets/changelog.py) gets one ``sweep`` row per deleted
row, its before image the deleted row, at ``until.just_below()`` (fixed per sweep: a rerun
computes the same position). Why a replay by position is exact: a swept key ``k`` has no
event in ``(p, A)``, ``p < below`` its row's position and ``A >= until`` the applied
position at the sweep (else its row's position would be at least ``below``), and
``below <= until.just_below() < until``; so no event of ``k`` ties with the sweep row and
every later event of ``k`` sorts after it.
"""
from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .events import SNAPSHOT
from .positions import Position
from .schema import TableSchema
from .targets.base import SWEEP, append_marked
from .values import comparable_key

log = logging.getLogger(__name__)
DELETING = "sweeps_deleting"   # Redis: {"table|target": {"below", "count"}} of a sweep about to delete


def orphan_sweep(rid: str, table: str, progress: dict) -> dict | None:
    """The sweep a finished range dump of ``table`` registers, from its progress; None for
    key-list dumps and for progress written before sweeps existed."""
    if "head_before" not in progress or not progress.get("done"):
        return None
    ends = []
    if progress.get("last_hw"):
        hw = Position.decode(progress["last_hw"])
        ends.append(Position(hw.log, hw.offset + 1, 0))  # past the HW transaction's snapshot rows
    if progress.get("head_end"):
        ends.append(Position.decode(progress["head_end"]))
    if not ends:
        return None
    return {"request": rid, "table": table, "below": progress["head_before"], "until": max(ends).encode()}


def snapshot_keys(store, schema: TableSchema, below: Position, until: Position) -> pa.Table:
    """The key columns of every snapshot event of ``schema`` with below < pos < until, file by
    file (only the keys are held). Each file is read in its own shape (an earlier dump's rows
    may be in a shape the table has changed from since): only its key fields are taken."""
    key_fields = [f for f in schema.row_struct() if f.name in schema.key]
    parts = []
    for path in store.files_for_range(schema.qualified, below, until):
        data = pq.read_table(path, filesystem=store.fs, columns=["op", "pos", "after"])
        mask = pc.and_(pc.equal(data["op"], SNAPSHOT),
                       pc.and_(pc.greater(data["pos"], below.encode()), pc.less(data["pos"], until.encode())))
        after = data.filter(mask)["after"].combine_chunks()
        if len(after):
            parts.append(pa.table({f.name: pc.struct_field(after, f.name).cast(f.type) for f in key_fields}))
    if not parts:
        return pa.schema(key_fields).empty_table()
    return pa.concat_tables(parts)


def keys_in_source(source_cfg, schema: TableSchema):
    """``in_source`` of PostgresTarget.delete_orphans: which of some keys the source holds
    now (a bound select by key), as ``values.comparable_key`` tuples."""
    def check(keys: list[tuple]) -> set[tuple]:
        from .sources import open_source
        with open_source(source_cfg) as source:
            s = source.table_schema(schema.qualified)
            present = source.present_keys(s, keys)
        return {tuple(comparable_key(t, v) for t, v in zip(s.key_types, k)) for k in present}
    return check


def sweep_table(target, target_name: str, store, state, source_cfg, schema: TableSchema) -> int | None:
    """Run the table's pending sweep on ``target`` if the apply has reached it: the number of
    orphans deleted, or None (no sweep pending, or not yet applied far enough). Each
    candidate is looked up in the source before it goes (see delete_orphans)."""
    source_name = source_cfg.name
    sweep = state.pending_sweep(schema.qualified, target_name)
    if sweep is None:
        return None
    below, until = Position.decode(sweep["below"]), Position.decode(sweep["until"])
    applied = target.applied_pos(source_name, schema)
    if applied is None or applied < until:
        log.info("%s: orphan sweep of dump %s waits for the apply to reach %s (at %s)",
                 schema.qualified, sweep["request"], until, applied)
        return None
    t0 = time.monotonic()
    keep = snapshot_keys(store, schema, below, until)
    mark = f"{schema.qualified}|{target_name}"

    def before_delete(rows: pa.Table) -> None:
        # the changelog rows first, then the delete. Killed between the two, the rerun (which
        # appends no second set: append_marked looks for them) may find fewer orphans: a key
        # it no longer deletes was written again by an event past ``until`` (so after the
        # sweep row in a replay), or is back in the source by such an event, not yet applied;
        # a key only the rerun deletes has a logged delete, which the changelog gets later.
        # Either way the replay of the changelog is the table once the apply has caught up.
        append_marked(target, schema, source_name, SWEEP, until.just_below(), rows)
        state.r.hset(state.k(DELETING), mark, json.dumps({"below": sweep["below"], "count": rows.num_rows}))

    deleted = target.delete_orphans(schema, source_name, keep, below, until,
                                    in_source=keys_in_source(source_cfg, schema), before_delete=before_delete)
    if deleted is None:  # the checkpoint was reset meanwhile
        return None
    if not deleted:   # a rerun after a delete commit whose sweep was not recorded: the count it deleted
        was = json.loads(state.r.hget(state.k(DELETING), mark) or "{}")
        deleted = was["count"] if was.get("below") == sweep["below"] else 0
    state.finish_sweep(sweep, target_name, deleted)
    state.r.hdel(state.k(DELETING), mark)
    log.info("%s: orphan sweep of dump %s on %s: %d rows deleted (%d keys kept, %.1fs)", schema.qualified,
             sweep["request"], target_name, deleted, keep.num_rows, time.monotonic() - t0)
    return deleted
