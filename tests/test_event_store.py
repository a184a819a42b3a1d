"""engine/store.py with a zombie tail's files (issue 15): a tail paused past its lease may
write a segment after another tail took over from the same checkpoint. Hypothesis builds a
live tail's chain of flushes with the engine's own store (a flush in one file, or in parts
as a transaction larger than a flush is written), then adds zombie files: one per
chosen flush start, holding the events the zombie had read when it flushed (a prefix of
the log from that start, possibly longer than the live flush: it read on). Whatever the
zombie wrote, every read the engine makes (``read_range``, and ``files_for_range`` as both
apply paths and the sweep use it) gives exactly the live chain's events, each once.
"""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.events import INSERT, UPDATE, Event, event_arrow_schema
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.store import LOG_PREFIX, SUFFIX, EventStore, log_segment_name

T = TableSchema("app", "t", (Column("id", "int32", False), Column("v", "string")), ("id",))


def event(i: int) -> Event:
    row = {"id": i % 5, "v": f"v{i}"}
    return Event(T.qualified, INSERT if i < 5 else UPDATE, (i % 5,), None, row, Position(1, 100 + i, 0), 0)


@st.composite
def tails(draw):
    """(events, live flushes as (start index, end index), zombie files as (start index, end index))."""
    n = draw(st.integers(1, 30))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=5))) if n > 1 else []
    bounds = [0, *cuts, n]
    live = list(zip(bounds, bounds[1:]))
    zombies = []
    for start, _ in draw(st.lists(st.sampled_from(live), max_size=3)):
        zombies.append((start, draw(st.integers(start + 1, n))))  # what it had read, maybe past the live end
    return [event(i) for i in range(n)], live, zombies


def pos_of(events, i: int) -> Position:
    return events[i].pos if i < len(events) else Position(1, 100 + len(events), 0)


@settings(max_examples=150, deadline=None)
@given(tails(), st.data())
def test_a_zombie_tails_segments_change_no_read(tmp_path_factory, case, data):
    events, live, zombies = case
    store = EventStore(str(tmp_path_factory.mktemp("store")), "src")
    for start, end in live:   # a flush, maybe in parts (a transaction written as it was read)
        cuts = sorted(data.draw(st.sets(st.integers(start + 1, end - 1), max_size=2), label="parts")) \
            if end - start > 1 else []
        for part, (a, b) in enumerate(zip([start, *cuts], [*cuts, end])):
            store.write_log_segment(T, pos_of(events, start), events[a:b], "7", part=part)
    for start, end in zombies:   # the zombie's fencing number is older: 6
        store.write_log_segment(T, pos_of(events, start), events[start:end], "6")
    checkpoint = pos_of(events, len(events))
    lo_i = data.draw(st.integers(-1, len(events) - 1), label="lo")
    hi_i = data.draw(st.integers(lo_i + 1, len(events)), label="hi")
    lo = None if lo_i < 0 else events[lo_i].pos
    hi = min(pos_of(events, hi_i), checkpoint)
    want = [e.pos.encode() for e in events if (lo is None or e.pos > lo) and e.pos < hi]
    assert store.read_range(T, lo, hi)["pos"].to_pylist() == want
    # the apply paths read files_for_range's files and keep lo <= pos < hi (then one per key)
    got = set()
    for f in store.files_for_range(T.qualified, lo, hi):
        got |= {p for p in pq.read_table(f, schema=event_arrow_schema(T))["pos"].to_pylist()
                if (lo is None or p >= lo.encode()) and p < hi.encode()}
    assert got >= set(want)


def test_segment_names_and_the_name_before_writers(tmp_path):
    store = EventStore(str(tmp_path), "src")
    a, b = [event(i) for i in range(3)], [event(i) for i in range(3, 6)]
    # a store written before writer names: still read, and still swept past the checkpoint
    old = store.write_log_segment(T, a[0].pos, a, "1").replace(".1" + SUFFIX, SUFFIX)
    (tmp_path / "events/src/app.t" / log_segment_name(a[0].pos, "1")).rename(old)
    assert old.rsplit("/", 1)[-1] == f"{LOG_PREFIX}{a[0].pos.encode()}{SUFFIX}"
    store.write_log_segment(T, b[0].pos, b, "2")
    end = Position(1, 200, 0)
    assert store.read_range(T, None, end)["pos"].to_pylist() == [e.pos.encode() for e in a + b]
    table_dir = tmp_path / "events/src/app.t"
    (table_dir / f"{log_segment_name(b[0].pos, '3')}.tmp-dead").write_bytes(b"half")   # a dead tail's
    (table_dir / f"snap-{b[0].pos.encode()}{SUFFIX}.tmp-live").write_bytes(b"half")   # a runner writing now
    removed = store.remove_uncommitted_logs(b[0].pos)
    assert sorted(p.name for p in table_dir.glob("*.tmp-*")) == [f"snap-{b[0].pos.encode()}{SUFFIX}.tmp-live"]
    assert [r.rsplit("/", 1)[-1] for r in removed] == [log_segment_name(b[0].pos, "2")]
    assert store.read_range(T, None, end)["pos"].to_pylist() == [e.pos.encode() for e in a]
    for bad in ("1|2", "", "a.b"):
        with pytest.raises(ValueError, match="alphanumeric"):
            log_segment_name(a[0].pos, bad)


def test_the_sweep_reads_each_file_in_its_own_shape(tmp_path):
    """The orphan sweep's keys come from files written in the shapes the table had (issue 27:
    a snapshot or segment from before a type change was read with today's event schema and
    failed the apply of every table, e.g. "Failed to parse string: 'v1' as int32")."""
    from airflow_provider_dblog.engine.events import SNAPSHOT, events_to_arrow
    from airflow_provider_dblog.engine.sweep import snapshot_keys
    store = EventStore(str(tmp_path), "src")
    before = T   # v string
    after = TableSchema("app", "t", (Column("id", "int32", False), Column("v", "int64")), ("id",))
    old = [Event(T.qualified, SNAPSHOT, (1,), None, {"id": 1, "v": "v1"}, Position(1, 10, 0), 0)]
    new = [Event(T.qualified, SNAPSHOT, (2,), None, {"id": 2, "v": 2}, Position(1, 20, 0), 0)]
    store.write_snapshot(before, Position(1, 10, 0), events_to_arrow(before, old))
    store.write_snapshot(after, Position(1, 20, 0), events_to_arrow(after, new))
    keys = snapshot_keys(store, after, Position(1, 1, 0), Position(1, 30, 0))
    assert sorted(keys["id"].to_pylist()) == [1, 2]
