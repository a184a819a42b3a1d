"""Schema versions interleaved with dump windows (issue 16), on the engine's own store and
checks: Hypothesis writes a table's schema versions at random log positions with
``EventStore.write_schema_version`` (the tail's call), then opens windows (LW, HW) at
random, each chunk selected in some shape: the one holding when its runner last read the
table (possibly long before the LW) or at a moment inside the window. ``version_at`` reads
the stored versions back as the apply and the tail do, and ``chunk_shape_problem`` (what
``DumpRunner.finish_chunk`` asks) must let a chunk through exactly when every row of it is
in the shape that holds throughout its window: the selected shape is the one holding at
the LW, and no version begins inside (LW, HW].
"""
from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.schema_history import as_stored, chunk_shape_problem, version_at
from airflow_provider_dblog.engine.store import EventStore

TABLE = "app.t"


def shape(n: int) -> TableSchema:
    """The n-th shape of the table: n columns added after the key."""
    return TableSchema("app", "t", (Column("id", "int64", False),) + tuple(Column(f"c{i}", "string")
                                                                          for i in range(n)), ("id",))


def pos(offset: int) -> Position:
    return Position(1, offset, 0)


@st.composite
def histories(draw):
    """Version positions (the first at the tail's start), and windows with the position at
    which each chunk's shape was read."""
    starts = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=6)))
    windows = []
    for _ in range(draw(st.integers(1, 8))):
        lw = draw(st.integers(starts[0], 220))
        hw = draw(st.integers(lw + 1, 230))
        read_at = draw(st.integers(starts[0], hw))   # the runner's cache, or a read inside the window
        windows.append((lw, hw, read_at))
    return starts, windows


@settings(max_examples=150, deadline=None)
@given(histories())
def test_a_chunk_passes_exactly_when_it_is_in_the_shape_holding_throughout_its_window(history):
    starts, windows = history
    with tempfile.TemporaryDirectory() as root:
        store = EventStore(root, "src")
        for n, start in enumerate(starts):
            store.write_schema_version(TABLE, pos(start), as_stored({"schema": shape(n).to_dict()}))
        versions = store.schema_versions(TABLE)
        assert [p for p, _ in versions] == [pos(s) for s in starts]
        for lw, hw, read_at in windows:
            selected = TableSchema.from_dict(version_at(versions, pos(read_at))["schema"])
            problem = chunk_shape_problem(versions, selected, pos(lw), pos(hw))
            # the shape holding at the LW, by the model: the last version begun at or before it
            at_lw = max(n for n, s in enumerate(starts) if s <= lw)
            changed_inside = any(lw < s <= hw for s in starts)
            assert (problem is None) == (selected == shape(at_lw) and not changed_inside), \
                (starts, lw, hw, read_at, problem)
            if problem is None:   # then the apply, reading at the HW, sees that shape too
                assert TableSchema.from_dict(version_at(versions, pos(hw))["schema"]) == selected
