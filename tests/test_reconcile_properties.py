"""Property tests of the watermark reconciler (the paper's Algorithm 1, steps 2-7).

Hypothesis generates programs: random transactions (inserts, updates, deletes,
re-inserts, writes to keys of the chunk being read, binlog rotations, writes to
another table) interleaved at random points with the steps of one or more dumps:
a chunked dump of the whole table (random chunk sizes, each chunk read as several
partitions at different moments inside its window) and/or a primary-key-list
dump (random keys, some absent). Every window runs LW, SELECT (non-stale), HW,
then -- once the tail has passed the HW, other steps may run before -- the real
``engine.reconcile.reconcile`` on the table's log events strictly inside the
window. The output stream (log events + snapshot events, by position) is applied
to a model of the target (``sim.Target``) and checked against the DESIGN's
invariants: order of history, convergence, idempotent replay. Apply runs also
interleave with the program, each up to the frontier (min of the tail checkpoint
and the open windows' floors), as the real apply does.

The engine bugs these tests found are kept at the end as regression tests.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, Phase, event, example, given, note, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.errors import InvalidKeyError
from airflow_provider_dblog.engine.events import DELETE, SNAPSHOT, Event, events_from_arrow, events_to_arrow
from airflow_provider_dblog.engine.positions import ZERO, Position
from airflow_provider_dblog.engine.reconcile import reconcile
from airflow_provider_dblog.engine.schema import Column, TableSchema

from sim import (ITEMS, LINES, RATES, SCHEMAS, KeyDump, RangeDump, SimSource, Target, arrow_rows, make_row, merged_stream, normalize_key, random_split)

# -- what hypothesis draws ---------------------------------------------------------
# Small key universes, so writes hit the same keys (updates, deletes, re-inserts,
# keys of the chunk being read) often; each has the extremes of its types too.
KEYS = {
    "items": st.one_of(st.integers(0, 12), st.sampled_from([-(2 ** 63), -1, 2 ** 63 - 1])).map(
        lambda i: (i,)),
    "lines": st.tuples(st.one_of(st.integers(-1, 2), st.sampled_from([-(2 ** 31), 2 ** 31 - 1])),
                       st.sampled_from(["", "a", "B", "é", "😀", "a b"])),
    "rates": st.tuples(st.sampled_from([dt.date(1970, 1, 1), dt.date(2024, 2, 29), dt.date(2024, 3, 1)]),
                       st.sampled_from([Decimal(x) for x in
                                        ("-9999.99", "-1.50", "0.00", "0.01", "12.30", "9999.99")])),
}
NOISE = {"items": LINES, "lines": RATES, "rates": ITEMS}  # another table sharing the log
NOISE_KEY = {"items": (0, "a"), "lines": (dt.date(2024, 2, 29), Decimal("0.01")), "rates": (7,)}


@dataclass(frozen=True)
class Program:
    schema: str  # "items" | "lines" | "rates"
    mode: str  # "fresh": tail starts before the first write, empty target;
    #            "bootstrap": rows exist before the tail starts, empty target, a full dump;
    #            "repair": the target was bootstrapped, then corrupted; a key-list dump covers it
    initial: tuple = ()  # keys that exist before the tail starts (not in the log)
    corrupt: tuple = ()  # ("value" | "extra" | "drop", key, held position) in the target
    dumps: tuple = ()  # ("range", chunk_sizes, parts) | ("keys", keys, batch_sizes)
    steps: tuple = ()  # ("txn", ((op, key[, new_key]), ...)) | ("dump", i) | ("rotate",) | ("noise",)
    #                    | ("apply", lag): the tail reads on to `lag` entries from the end, an apply runs


def range_dumps():
    return st.tuples(st.just("range"), st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
                     st.integers(1, 3))


def key_dumps(keys, must=()):
    return st.tuples(st.just("keys"),
                     st.lists(keys, max_size=10).flatmap(
                         lambda ks: st.permutations(list(must) + ks)).map(tuple),
                     st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple))


@st.composite
def programs(draw, moves: bool = False, full_repair: bool = False) -> Program:
    """``full_repair``: a damaged target repaired by a full-table dump and its orphan sweep."""
    schema = draw(st.sampled_from(sorted(KEYS)))
    keys = KEYS[schema]
    mode = "repair" if full_repair else draw(st.sampled_from(["fresh", "bootstrap", "repair"]))
    initial = () if mode == "fresh" else tuple(draw(st.lists(keys, max_size=12, unique=True)))
    corrupt: tuple = ()
    if mode == "repair":
        held = st.builds(Position, st.just(0), st.integers(0, 10 ** 6), st.integers(0, 9))
        damaged = []
        for key in draw(st.lists(keys, min_size=1, max_size=5, unique=True)):
            kind = draw(st.sampled_from(["value", "drop"])) if key in initial else "extra"
            damaged.append((kind, key, draw(held)))
        corrupt = tuple(damaged)
    extra = st.lists(st.one_of(range_dumps(), key_dumps(keys)), max_size=1)
    if mode == "fresh":
        dumps = draw(st.lists(st.one_of(range_dumps(), key_dumps(keys)), max_size=2))
    elif mode == "bootstrap":
        dumps = [draw(range_dumps())] + draw(extra)
    elif full_repair:
        dumps = [draw(range_dumps())] + draw(extra)
    else:
        dumps = [draw(key_dumps(keys, must=[k for _, k, _ in corrupt]))] + draw(extra)
    dumps = tuple(draw(st.permutations(dumps)))
    ops = ["put", "put", "delete"] + (["move"] if moves else [])
    # writes often hit the keys of an open window's chunk ("@chunk", n), resolved when the
    # program runs), or the pre-existing keys: those are the rows the chunks read
    chunk_ref = st.tuples(st.just("@chunk"), st.integers(0, 20))
    wkeys = st.one_of(keys, chunk_ref, *([st.sampled_from(initial)] if initial else []))

    def write(op):
        if op == "move":
            return st.tuples(st.just(op), wkeys, keys)
        return st.tuples(st.just(op), wkeys)

    txn = st.tuples(st.just("txn"), st.lists(st.sampled_from(ops).flatmap(write), min_size=1,
                                             max_size=3).map(tuple))
    other = st.one_of(txn, txn, txn, st.just(("rotate",)), st.just(("noise",)),
                      st.tuples(st.just("apply"), st.integers(0, 4)))
    if dumps:
        # rounds of a few dump steps, then a few writes: windows with writes inside are common
        dump_step = st.tuples(st.just("dump"), st.integers(0, len(dumps) - 1))
        rounds = st.lists(st.tuples(st.lists(dump_step, min_size=1, max_size=3),
                                    st.lists(other, min_size=1, max_size=3)), min_size=3, max_size=40)
        prologue = draw(st.lists(other, max_size=8))  # writes before any dump starts
        steps = tuple(prologue) + tuple(s for ds, ws in draw(rounds) for s in ds + ws)
    else:
        steps = tuple(draw(st.lists(other, max_size=30)))
    return Program(schema, mode, initial, corrupt, dumps, steps)


# -- running a program -----------------------------------------------------------------
@dataclass
class Run:
    program: Program
    sim: SimSource
    table: TableSchema
    dumps: list
    target0: Target
    stream: list
    live: Target  # the target of the apply runs interleaved with the program (real apply's shape)
    held_back: int = 0  # apply runs whose frontier an open window's floor held below the checkpoint
    swept: list = None  # with sweeps: per range dump whose sweep ran, the keys it deleted

    @property
    def windows(self):
        return [w for d in self.dumps for w in d.windows]


def initial_target(sim: SimSource, table: TableSchema, program: Program) -> Target:
    target = Target(table)
    if program.mode != "repair":
        return target  # empty
    for key, row in sim.initial[table.qualified].items():  # bootstrapped earlier, at some old position
        target.rows[key] = dict(row)
        target.positions[key] = ZERO
    for kind, key, held in program.corrupt:
        key = normalize_key(table, key)
        if kind == "value":
            target.rows[key], target.positions[key] = make_row(table, key, -1), held
        elif kind == "extra":
            target.rows[key], target.positions[key] = make_row(table, key, -2), held
        else:  # a lost row
            target.rows.pop(key, None)
            target.positions.pop(key, None)
    return target


def run_sweeps(sim: SimSource, table: TableSchema, dumps: list, live: Target, swept: dict) -> None:
    """engine.sweep.sweep_table after an apply: each finished range dump's sweep, once the
    apply has reached it, keeping every snapshot key the output log holds in its range."""
    for i, d in enumerate(dumps):
        sweep = d.sweep() if isinstance(d, RangeDump) else None
        if sweep is None or i in swept:
            continue
        below, until = Position.decode(sweep["below"]), Position.decode(sweep["until"])
        keep = {e.key for e in sim.durable(table) if e.op == SNAPSHOT and below < e.pos < until}
        gone = live.sweep(sweep, keep)
        if gone is not None:
            swept[i] = gone
            for key in gone:  # only rows the source did not have at the apply's position
                assert sim.state_after(table, key, live.applied) is None, (
                    f"the sweep deleted {key}, which the source holds at {live.applied}")


def run_program(program: Program, reconcile_fn=reconcile, sweep: bool = False) -> Run:
    sim = SimSource([ITEMS, LINES, RATES])
    table = SCHEMAS[program.schema]
    sim.preload(table, program.initial)
    target0 = initial_target(sim, table, program)
    dumps = []
    for spec in program.dumps:
        if spec[0] == "range":
            dumps.append(RangeDump(sim, table, spec[1], spec[2], reconcile_fn=reconcile_fn))
        else:
            dumps.append(KeyDump(sim, table, spec[1], spec[2], reconcile_fn=reconcile_fn))

    def resolve(key: tuple) -> tuple | None:
        if key[0] != "@chunk":
            return key
        windows = [d.open_keys for d in dumps if d.open_keys]
        pool = windows[key[1] % len(windows)] if windows else sorted(sim.db[table.qualified])
        return pool[key[1] % len(pool)] if pool else None

    live = target0.copy()
    held_back = 0
    swept: dict[int, list] = {}

    def landed_above_the_apply(d, before: int) -> None:
        for w in d.windows[before:]:  # a snapshot under the apply checkpoint would be lost
            assert live.applied is None or all(e.pos >= live.applied for e in w.out), (
                f"window {w.lw}..{w.hw} (floor {w.floor}) wrote below the applied {live.applied}")

    for step in program.steps:
        if step[0] == "txn":
            writes = [(w[0], table, *map(resolve, w[1:])) for w in step[1]]
            sim.commit([w for w in writes if None not in w])
        elif step[0] == "dump":
            d = dumps[step[1]]
            n = len(d.windows)
            d.step()
            landed_above_the_apply(d, n)
        elif step[0] == "rotate":
            sim.rotate()
        elif step[0] == "noise":
            sim.commit([("put", NOISE[program.schema], NOISE_KEY[program.schema])])
        elif step[0] == "apply":
            sim.tail_advance(step[1])
            held_back += sim.frontier() < sim.checkpoint()
            live.apply_up_to(sim.durable(table), sim.frontier())
            if sweep:
                run_sweeps(sim, table, dumps, live, swept)
    for d in dumps:  # the log is drained: every dump finishes
        n = len(d.windows)
        d.finish()
        landed_above_the_apply(d, n)
    sim.tail_advance()
    live.apply_up_to(sim.durable(table), sim.frontier())
    if sweep:
        run_sweeps(sim, table, dumps, live, swept)
    return Run(program, sim, table, dumps, target0, merged_stream(sim, table, dumps), live, held_back,
               list(swept.values()))


# -- the properties ----------------------------------------------------------------
def check_windows(run: Run) -> None:
    """Each window's output is exactly Algorithm 1's steps 6-7, at the right positions."""
    table, sim = run.table, run.sim
    for w in run.windows:
        assert w.lw < w.hw
        changed = w.changed  # keys written inside (LW, HW), old keys of a moved row included
        chunk_keys = [table.key_of(r) for r in w.selected]
        snaps = [e for e in w.out if e.op == SNAPSHOT]
        deletes = [e for e in w.out if e.op == DELETE]
        assert len(snaps) + len(deletes) == len(w.out)
        assert all(e.table == table.qualified for e in w.out)
        # never a snapshot of a key that changed inside its window ...
        stale = [e.key for e in snaps if e.key in changed]
        assert not stale, f"snapshot rows for keys changed in the window: {stale}"
        # ... and every other selected row, once
        assert sorted(e.key for e in snaps) == sorted(k for k in set(chunk_keys) if k not in changed)
        assert (w.result.selected, w.result.kept, w.result.dropped) == (
            len(w.selected), len(snaps), len(w.selected) - len(snaps))
        if w.requested is None:
            assert not deletes
        else:  # requested keys absent at the HW (and untouched in the window) come out as deletes
            requested = {normalize_key(table, k) for k in w.requested}
            absent = requested - set(chunk_keys)
            written = {e.key for e in w.window_events}  # the window's keys, by the key column
            assert absent - changed <= {e.key for e in deletes} <= absent - written
            assert len(deletes) == len({e.key for e in deletes})
            assert {tuple(k) for k in w.result.missing} == {e.key for e in deletes}
        # positions: after the HW, before anything the log holds after the HW, in key order
        positions = [e.pos for e in w.out]
        assert positions == sorted(set(positions))
        assert all(p > w.hw and (p.log, p.offset) == (w.hw.log, w.hw.offset) for p in positions)
        nxt = sim.entry_after(w.hw)
        if nxt is not None:
            assert all(p < nxt.pos for p in positions)
        assert [e.key for e in snaps] == sorted(e.key for e in snaps)
        # every emitted row is the source's true state at its position
        for e in w.out:
            assert e.row == sim.state_after(table, e.key, e.pos), (
                f"window {w.lw}..{w.hw}: {e.op} of {e.key} at {e.pos} is not the source's state")


def check_stream(run: Run) -> None:
    """The output event log: one event per position, each the source's state at that position."""
    positions = [e.pos for e in run.stream]
    assert len(set(positions)) == len(positions), "two events share a position"
    assert positions == sorted(positions)
    for e in run.stream:
        assert e.row == run.sim.state_after(run.table, e.key, e.pos)


def converged(run: Run, target: Target) -> None:
    expected = run.sim.db[run.table.qualified]
    missing = sorted(set(expected) - set(target.rows))
    extra = sorted(set(target.rows) - set(expected))
    wrong = sorted(k for k in set(expected) & set(target.rows) if expected[k] != target.rows[k])
    assert not (missing or extra or wrong), f"target differs: missing {missing}, extra {extra}, wrong {wrong}"


def check_order(run: Run, target: Target) -> None:
    for key, delivered in target.delivered.items():
        assert all(a < b for a, b in zip(delivered, delivered[1:])), f"{key}: {delivered}"
        held = run.target0.positions.get(key)
        assert held is None or delivered[0] > held


def classify(run: Run) -> None:
    """Labels for ``--hypothesis-show-statistics``: are the interesting cases generated?"""
    event(f"mode {run.program.mode}, table {run.program.schema}")
    ws = run.windows
    event(f"windows: {'0' if not ws else '1-3' if len(ws) <= 3 else '4-10' if len(ws) <= 10 else '>10'}")
    if any(w.result.dropped for w in ws):
        event("a window dropped stale chunk rows")
    if any(w.result.missing for w in ws):
        event("a key-list window emitted deletes for absent keys")
    if any(w.reads > 1 and w.window_events for w in ws):
        event("a partitioned read with writes in its window")
    if run.held_back:
        event("an apply's frontier was held back by an open window")
    if any(w.lw.log != w.hw.log for w in ws):
        event("a binlog rotation inside a window")
    if any(isinstance(run.sim.entry_after(w.hw), Event) for w in ws):
        event("a log event right after a HW")


FIGURE_3 = Program(
    "items", "bootstrap", initial=tuple((i,) for i in range(1, 7)),
    dumps=(("range", (6,), 1),),
    steps=(("dump", 0), ("dump", 0),  # the key range captured, the chunk k1..k6 planned
           ("dump", 0),  # LW
           ("txn", (("put", (1,)),)),  # k1 changes before the select ...
           ("dump", 0),  # SELECT k1..k6
           ("txn", (("put", (3,)),)),  # ... k3 after it
           ("dump", 0)))  # HW; the reconcile step runs when the program ends


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
@example(FIGURE_3)
@example(Program("lines", "repair", initial=((0, "a"), (1, "B")),
                 corrupt=(("value", (0, "a"), Position(0, 5, 0)), ("extra", (2, "é"), Position(0, 9, 1)),
                          ("drop", (1, "B"), Position(0, 1, 0))),
                 dumps=(("keys", ((2, "é"), (0, "a"), (1, "B"), (-1, "")), (2,)),),
                 steps=(("dump", 0), ("txn", (("delete", (0, "a")),)), ("dump", 0), ("dump", 0))))
def test_windows_order_and_convergence(program: Program) -> None:
    run = run_program(program)
    note(f"{len(run.windows)} windows, {len(run.stream)} events")
    classify(run)
    check_windows(run)
    check_stream(run)
    target = run.target0.copy().apply(run.stream)
    check_order(run, target)
    converged(run, target)
    # the same, applied incrementally up to the frontier while the program ran
    assert run.sim.durable(run.table) == run.stream
    check_order(run, run.live)
    converged(run, run.live)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.lists(st.integers(0, 1000), max_size=8), st.integers(0, 1000), st.integers(0, 1000))
def test_apply_is_idempotent_and_batch_independent(program: Program, cuts: list[int], crash: int,
                                                   back: int) -> None:
    run = run_program(program)
    stream = run.stream
    n = len(stream)
    i = crash % (n + 1)
    j = back % (i + 1)
    batches = random_split(stream, [c % (n + 1) for c in cuts])
    for tombstones in (False, True):
        start = run.target0.copy()
        start.tombstones = tombstones
        once = start.copy().apply(stream)
        converged(run, once)
        # replaying the whole stream gives the same target
        twice = once.copy().apply(stream)
        assert twice.rows == once.rows and twice.positions == once.positions
        # a crash after `crash` events, then a replay from an earlier point
        resumed = start.copy().apply(stream[:i]).apply(stream[j:])
        assert resumed.rows == once.rows and resumed.positions == once.positions
        # batches cut at random positions, each reduced to the latest event per key
        batched = start.copy()
        for batch in batches:
            batched.apply_batch(batch)
        assert batched.rows == once.rows and batched.positions == once.positions
        check_order(run, batched)
        # the last batch merged again (as if its checkpoint had not moved) changes nothing; with
        # tombstones any older batch too. Without them an older batch would bring deleted rows
        # back: the real apply never re-reads below its checkpoint (merge and checkpoint are one
        # transaction), which is what makes it idempotent.
        if batches:
            again = batched.copy().apply_batch(
                batches[crash % len(batches)] if tombstones else batches[-1])
            assert again.rows == once.rows and again.positions == once.positions
    # the real apply's shape: frontiers at the cuts, each run from the apply checkpoint
    real = run.target0.copy()
    frontiers = sorted({stream[c % n].pos for c in cuts}) if n else []
    for f in frontiers + [Position(2 ** 32 - 1, 0, 0)]:
        real.apply_up_to(stream, f)
        replay = real.copy()
        assert replay.apply_up_to(stream, f) == []  # at the checkpoint already: nothing to do
        assert replay.state() == real.state()
    assert real.rows == once.rows
    check_order(run, real)


# -- explicit examples ------------------------------------------------------------------
def test_figure_3_drops_k1_k3_and_emits_the_rest_at_hw() -> None:
    run = run_program(FIGURE_3)
    [w] = run.windows
    assert {e.key for e in w.window_events} == {(1,), (3,)}
    assert (w.result.selected, w.result.kept, w.result.dropped) == (6, 4, 2)
    assert [(e.op, e.key, e.pos) for e in w.out] == [
        (SNAPSHOT, (k,), w.hw.with_seq(i + 1)) for i, k in enumerate([2, 4, 5, 6])]
    check_windows(run)
    target = run.target0.copy().apply(run.stream)
    converged(run, target)
    # k1 and k3 come from the log (their newest versions), the rest from the snapshot
    assert target.positions[(1,)] < w.hw and target.positions[(3,)] < w.hw
    assert all(target.positions[(k,)] > w.hw for k in (2, 4, 5, 6))


def test_a_reconciler_that_keeps_stale_rows_is_caught() -> None:
    """The properties are not vacuous: ignoring the window (no step 6) breaks them."""

    def no_step_6(table, chunk, window_events, hw, requested_keys=None):
        return reconcile(table, chunk, window_events.slice(0, 0), hw, requested_keys=requested_keys)

    run = run_program(FIGURE_3, reconcile_fn=no_step_6)
    with pytest.raises(AssertionError, match="changed in the window"):
        check_windows(run)
    target = run.target0.copy().apply(run.stream)
    with pytest.raises(AssertionError, match="target differs"):
        converged(run, target)


def test_reconcile_of_an_empty_chunk_and_window() -> None:
    empty_window = events_to_arrow(ITEMS, [])
    result = reconcile(ITEMS, arrow_rows(ITEMS, []), empty_window, Position(1, 4, 0))
    assert (result.selected, result.kept, result.dropped, result.events.num_rows) == (0, 0, 0, 0)
    result = reconcile(ITEMS, arrow_rows(ITEMS, []), empty_window, Position(1, 4, 0),
                       requested_keys=[(5,)])
    [e] = events_from_arrow(ITEMS, result.events)
    assert (e.op, e.key, e.pos, result.missing) == (DELETE, (5,), Position(1, 4, 1), [(5,)])


def test_window_events_of_other_keys_drop_nothing() -> None:
    sim = SimSource([ITEMS])
    sim.preload(ITEMS, [(1,), (2,)])
    lw = sim.write_watermark("lw")
    sim.commit([("put", ITEMS, (3,)), ("delete", ITEMS, (3,))])
    rows = sim.select_range(ITEMS, None, (2,))
    hw = sim.write_watermark("hw")
    result = reconcile(ITEMS, arrow_rows(ITEMS, rows), events_to_arrow(ITEMS, sim.events(ITEMS, lw, hw)), hw)
    assert [e.key for e in events_from_arrow(ITEMS, result.events)] == [(1,), (2,)]


# -- regressions: engine bugs these tests found, fixed ------------------------------------
def test_primary_key_update_inside_the_window() -> None:
    program = Program("items", "bootstrap", initial=((1,),), dumps=(("range", (1,), 1),),
                      steps=(("dump", 0), ("dump", 0), ("dump", 0),  # LW
                             ("dump", 0),  # SELECT sees k1
                             ("txn", (("move", (1,), (2,)),)),  # UPDATE items SET id = 2 WHERE id = 1
                             ("dump", 0)))  # HW
    run = run_program(program)
    target = run.target0.copy().apply(run.stream)
    converged(run, target)  # k1 must not be resurrected by the snapshot at the HW


MOVE_UNDER_WINDOW = Program(  # hypothesis' shrunk example
    "rates", "fresh", dumps=(("range", (1,), 1),),
    steps=(("txn", (("put", (dt.date(1970, 1, 1), Decimal("-1.50"))),)),
           ("dump", 0), ("dump", 0), ("dump", 0),  # start, plan, LW
           ("dump", 0),  # SELECT sees (1970-01-01, -1.50)
           ("txn", (("move", ("@chunk", 0), (dt.date(1970, 1, 1), Decimal("-9999.99"))),)),
           ("dump", 0)))  # HW


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          database=None, report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate])
@given(programs(moves=True))
@example(MOVE_UNDER_WINDOW)
def test_primary_key_updates_keep_the_properties(program: Program) -> None:
    run = run_program(program)
    check_windows(run)
    converged(run, run.target0.copy().apply(run.stream))


# -- the orphan sweep of a full-table dump (engine/sweep.py) ----------------------------------
GHOST = Program("items", "repair", initial=((1,), (2,), (3,)),
                corrupt=(("extra", (7,), Position(0, 9, 0)), ("value", (2,), Position(0, 5, 0))),
                dumps=(("range", (2,), 1),),
                steps=(("dump", 0), ("txn", (("put", (9,)),)), ("dump", 0), ("dump", 0),
                       ("txn", (("delete", (1,)),)), ("dump", 0), ("dump", 0), ("apply", 0)))


def test_without_its_sweep_a_full_dump_leaves_an_orphan() -> None:
    """The control: a target row the source never had survives the dump alone."""
    run = run_program(GHOST)
    assert (7,) in run.live.rows
    with pytest.raises(AssertionError, match=r"extra \[\(7,\)\]"):
        converged(run, run.live)
    swept = run_program(GHOST, sweep=True)
    assert swept.swept == [[(7,)]]
    converged(swept, swept.live)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(moves=True, full_repair=True))
@example(GHOST)
@example(
    program=Program(schema='items',
     mode='repair',
     initial=((-9223372036854775808,),),
     corrupt=(('extra', (0,), Position(0, 0, 0)),),
     dumps=(('range', (1,), 1),),
     steps=(('dump', 0),
      ('txn', (('delete', (-9223372036854775808,)),)),
      ('dump', 0),
      ('rotate',),
      ('apply', 3),
      ('dump', 0),
      ('apply', 2))),
).via('discovered failure: the rows up to the max key deleted before the first chunk')
def test_a_full_dump_and_its_sweep_repair_any_damage_under_concurrent_writes(program: Program) -> None:
    """A damaged target (wrong values, rows the source never had, lost rows), a full-table
    dump while writes, key moves and applies interleave, the sweep run by the first apply
    that reaches it: the target converges, no key goes back in position, and the sweep
    deleted only keys the source did not have."""
    run = run_program(program, sweep=True)
    assert len(run.swept) == sum(1 for d in run.dumps if isinstance(d, RangeDump))
    event(f"sweep deleted {'0' if not any(run.swept) else 'some'} rows")
    check_order(run, run.live)
    converged(run, run.live)


def test_negative_zero_decimal_key_in_a_key_list_dump() -> None:
    key = RATES.parse_key(["2024-02-29", "-0.00"])  # the user's repair request, as dump.py parses it
    program = Program("rates", "repair", initial=((dt.date(2024, 2, 29), Decimal("0.00")),),
                      corrupt=(("value", (dt.date(2024, 2, 29), Decimal("0.00")), Position(0, 1, 0)),),
                      dumps=(("keys", (key,), (1,)),), steps=())
    run = run_program(program)
    target = run.target0.copy().apply(run.stream)
    converged(run, target)  # the repaired row is kept, not deleted


TS = TableSchema("shop", "ticks", (Column("at", "timestamp", False), Column("v", "int64")), ("at",))


def test_timestamp_key_with_offset_is_refused_not_deleted() -> None:
    with pytest.raises(InvalidKeyError, match="time zone"):
        TS.parse_key("2024-01-01T00:00:00+00:00")
    key = TS.parse_key("2024-01-01T00:00:00")
    row = {"at": dt.datetime(2024, 1, 1), "v": 1}
    result = reconcile(TS, arrow_rows(TS, [row]), events_to_arrow(TS, []), Position(1, 4, 0),
                       requested_keys=[key])
    ops = [(e.op, e.key) for e in events_from_arrow(TS, result.events)]
    assert ops == [(SNAPSHOT, (dt.datetime(2024, 1, 1),))], ops
