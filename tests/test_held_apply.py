"""engine/apply_plan.py held_at: where a table's apply stops so that no value that could not be
carried (an event with ``error``) ever reaches a target, and no sooner.

Hypothesis writes a table's log with the engine's own store (``EventStore``, the event
log's Parquet), with some events marked as the sources mark them (an uncarried value in the
row image: insert, update or snapshot; a delete whose key could not be carried), and asks
``held_at`` for the batch's end. Then, with the apply's own ``latest_per_key`` and
``flatten``: every row the batch writes is a carried one, and the batch could not go one
event further without writing an uncarried one.
"""
from __future__ import annotations

import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.apply_batch import flatten
from airflow_provider_dblog.engine.apply_plan import held_at, latest_per_key
from airflow_provider_dblog.engine.events import DELETE, INSERT, SNAPSHOT, UPDATE, Event, event_arrow_schema
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.store import EventStore

T = TableSchema("app", "t", (Column("id", "int32", False), Column("v", "string")), ("id",))
OPS = st.sampled_from([INSERT, UPDATE, DELETE, SNAPSHOT])


@st.composite
def logs(draw):
    events = []
    for i in range(draw(st.integers(1, 25))):
        op, key, bad = draw(OPS), draw(st.integers(1, 4)), draw(st.booleans()) and draw(st.booleans())
        image = {"id": key, "v": None if bad else f"v{i}"}
        events.append(Event(T.qualified, op, (key,), image if op == DELETE else None,
                            None if op == DELETE else image, Position(1, 100 + i, 0), 0,
                            f"{T.qualified}.v: no target holds it" if bad else None))
    return events


def batch(store, lo: str, hi: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = event_arrow_schema(T)
    files = store.files_for_range(T.qualified, None, Position(9, 0, 0))
    data = pa.concat_tables([pq.read_table(f, filesystem=store.fs, schema=schema) for f in files])
    return data.filter(pc.and_(pc.greater_equal(data["pos"], lo), pc.less(data["pos"], hi)))


@settings(max_examples=200)
@given(logs(), st.integers(0, 5))
def test_the_batch_stops_just_before_an_uncarried_row(tmp_path_factory, events, split):
    store = EventStore(str(tmp_path_factory.mktemp("store")), "src")
    cut = min(split, len(events))      # two flushes, as a tail writes them
    for start, part in ((Position(1, 0, 0), events[:cut]), (Position(1, 100 + cut, 0), events[cut:])):
        if part:
            store.write_log_segment(T, start, part, "1")
    files = store.files_for_range(T.qualified, None, Position(9, 0, 0))
    lo, hi = Position(1, 0, 0).encode(), Position(9, 0, 0).encode()
    at, why = held_at(store, files, lo, hi)
    end = at.encode() if at is not None else hi
    latest = latest_per_key(batch(store, lo, end))
    # what a target gets: each key's latest event; none of them may carry an uncarried value
    # (a delete that could not be carried is dropped by flatten: it deletes nothing)
    assert not [r for r in latest.to_pylist() if r["error"] is not None and r["op"] != DELETE]
    written = flatten(T, latest)
    assert written["v"].null_count == 0 and written.num_rows == sum(
        1 for r in latest.to_pylist() if r["error"] is None)
    if at is None:
        assert why is None
        return
    assert why and at.encode() in [e.pos.encode() for e in events]
    # one event further, and the event at ``at`` would be its key's latest: uncarried, not a delete
    held = next(e for e in events if e.pos == at)
    assert held.error is not None and held.op != DELETE
    further = latest_per_key(batch(store, lo, Position(at.log, at.offset + 1, 0).encode()))
    assert held.key[0] in [int(k[1:-1]) for k in further.filter(pc.is_valid(further["error"]))["key"].to_pylist()]
