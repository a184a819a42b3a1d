"""A Delta MERGE whose batch keys no file of the table can hold is built with its insert
clause only (targets/delta_maintain.py ``KeySpan.misses``: each file's statistics of the
leading integer key lie outside the batch's key ranges). Generated histories of batches
(inserts past the table's keys, into gaps between its files, updates and deletes of keys
it holds, re-inserts of deleted keys, stale replays) go through the target's own
``merge_batch`` into a real Delta table; after each the table holds exactly the newest
event of every key, once. No servers: delta-rs on a local directory."""
from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.config import TargetConfig
from airflow_provider_dblog.engine.events import DELETE, INSERT, UPDATE
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets.base import OP_COLUMN, POS_COLUMN
from airflow_provider_dblog.engine.targets.delta import DeltaTarget
from airflow_provider_dblog.engine.targets.delta_maintain import KeySpan

SCHEMA = TableSchema("db", "t", (Column("id", "int64", False), Column("v", "int32")), ("id",))
SOURCE = "src"

# one batch: (op, key) pairs; keys drawn around existing ranges so that gaps, edges and
# overlaps all occur
BATCH = st.lists(st.tuples(st.sampled_from([INSERT, UPDATE, DELETE]), st.integers(-3, 60)), min_size=1, max_size=25)


def _page(events: list[tuple[str, int]], log_no: int) -> pa.Table:
    """The batch's latest event per key (as the apply flattens it), positions in order."""
    latest: dict[int, tuple[str, int]] = {}
    for seq, (op, key) in enumerate(events):
        latest[key] = (op, seq)
    keys = sorted(latest)
    return pa.table({"id": pa.array(keys, pa.int64()),
                     "v": pa.array([log_no * 100 + latest[k][1] for k in keys], pa.int32()),
                     POS_COLUMN: pa.array([Position(log_no, 0, latest[k][1]).encode() for k in keys]),
                     OP_COLUMN: pa.array([latest[k][0] for k in keys])})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(BATCH, min_size=1, max_size=6))
def test_generated_batches_leave_the_newest_event_of_every_key_once(tmp_path_factory, batches):
    target = DeltaTarget(TargetConfig(name="lake", kind="delta", endpoint=None, source=SOURCE,
                                      path=str(tmp_path_factory.mktemp("delta"))))
    target.ensure_table(SCHEMA)
    model: dict[int, int] = {}
    for n, events in enumerate(batches, start=1):
        page = _page(events, n)
        span = KeySpan(["id"], page.schema)
        span.add(page)
        held = {r["id"] for r in target.read(SCHEMA).to_pylist()}
        if span.misses(DeltaTable(target.table_path(SCHEMA))):
            assert not held & set(page["id"].to_pylist()), (held, page)   # sound: no key it holds
        target.merge_batch(SCHEMA, page, SOURCE, Position(n, 1, 0), run_id=f"r{n}")
        for r in page.to_pylist():
            if r[OP_COLUMN] == DELETE:
                model.pop(r["id"], None)
            else:
                model[r["id"]] = r["v"]
        got = [(r["id"], r["v"]) for r in target.read(SCHEMA).to_pylist()]
        assert len(got) == len({k for k, _ in got}), "a key held twice"
        assert dict(got) == model
        # a replay of the same batch changes nothing (position guard)
        target.merge_batch(SCHEMA, page, SOURCE, Position(n, 1, 0), run_id=f"r{n}-again")
        assert dict((r["id"], r["v"]) for r in target.read(SCHEMA).to_pylist()) == model


def test_new_keys_past_and_between_the_tables_files_take_the_insert_only_merge(tmp_path):
    """Keys past every file, and keys in a gap between two files' ranges: insert-only; a key a
    file's range covers (held or not): the full MERGE. The result is the same either way."""
    target = DeltaTarget(TargetConfig(name="lake", kind="delta", endpoint=None, source=SOURCE, path=str(tmp_path)))
    target.ensure_table(SCHEMA)
    target.merge_batch(SCHEMA, _page([(INSERT, k) for k in range(0, 10)], 1), SOURCE, Position(1, 1, 0), run_id="a")
    target.merge_batch(SCHEMA, _page([(INSERT, k) for k in range(40, 50)], 2), SOURCE, Position(2, 1, 0), run_id="b")
    dt = lambda: DeltaTable(target.table_path(SCHEMA))  # noqa: E731

    def misses(keys) -> bool:
        span = KeySpan(["id"], _page([(INSERT, k) for k in keys], 9).schema)
        span.add(_page([(INSERT, k) for k in keys], 9))
        return span.misses(dt())
    assert misses(range(60, 70)) and misses(range(20, 30)) and misses([-5, 25, 99])
    assert not misses([5]) and not misses([9, 60]) and not misses([45])   # inside a file's range
    target.merge_batch(SCHEMA, _page([(INSERT, k) for k in range(20, 25)] + [(UPDATE, 5)], 3), SOURCE,
                       Position(3, 1, 0), run_id="c")
    rows = {r["id"]: r["v"] for r in target.read(SCHEMA).to_pylist()}
    assert sorted(rows) == list(range(0, 10)) + list(range(20, 25)) + list(range(40, 50))
    assert rows[5] == 305
