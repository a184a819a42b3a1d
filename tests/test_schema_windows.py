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


@st.composite
def version_histories(draw):
    """Versions at random positions, each a change of shape or not (the same columns: a
    longer VARCHAR), some a TRUNCATE; an apply's checkpoint and frontier."""
    starts = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=8)))
    kinds = [draw(st.sampled_from(["add", "same", "truncate"])) for _ in starts[1:]]
    applied = draw(st.none() | st.integers(starts[0], 220))
    frontier = draw(st.integers(applied or starts[0], 230))
    return starts, kinds, applied, frontier


@settings(max_examples=200, deadline=None)
@given(version_histories())
def test_an_apply_steps_through_exactly_the_changes_of_shape_in_position_order(history):
    """The apply's planning (``apply_plan.next_change`` / ``shape_at``, on the engine's
    store) walked from a checkpoint to the frontier, as one apply run does: each batch is
    read in the shape holding at its start, ends at the next version that changes the
    table (an added column, a TRUNCATE; not a version of the same columns), and every such
    version between checkpoint and frontier is a step, once, in order."""
    from airflow_provider_dblog.engine.apply_plan import next_change, shape_at
    starts, kinds, applied, frontier = history
    with tempfile.TemporaryDirectory() as root:
        store = EventStore(root, "src")
        n = 0
        store.write_schema_version(TABLE, pos(starts[0]), as_stored({"schema": shape(0).to_dict()}))
        for start, kind in zip(starts[1:], kinds):
            n += kind == "add"
            store.write_schema_version(TABLE, pos(start), as_stored(
                {"schema": shape(n).to_dict()} | ({"truncated": True} if kind == "truncate" else {})))
        versions = store.schema_versions(TABLE)
        at, steps = None if applied is None else pos(applied), []
        while True:
            read_in = shape_at(versions, shape(99), at)
            holding = version_at(versions, at) if at is not None else versions[0][1]
            assert read_in == TableSchema.from_dict((holding or versions[0][1])["schema"])
            change = next_change(versions, at, pos(frontier))
            if change is None:
                break
            assert at is None or change[0] > at
            steps.append(change[0])
            at = change[0]
        expected = [pos(s) for s, k in zip(starts[1:], kinds) if k != "same"
                    and (applied is None or s > applied) and s <= frontier]
        assert steps == expected
