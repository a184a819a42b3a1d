"""The apply run's survey (engine/apply_survey.py) changes how fast a run is, never what it
does: hypothesis draws situations of several tables at once, and a run with the survey on
one target must leave the same tables, rows, checkpoints and per-table results as a run
without it (every table through ``plan_table``) on a twin target with the same history.

A situation, on the real Redis, event store and target (PostgreSQL; Delta for shapes a
lake refuses): a first apply at frontier ``A``, then more log flushes up to ``F`` (``F``
may equal ``A``). Per table, drawn: events in any flush (at a flush's first position,
inside, at its last), before or after ``A``; a second schema version (a column added, or
two columns alike but for case, or under ``ignore``) at a position before, at or after
``A`` or ``F``; a zombie tail's duplicate file; a dump's snapshot file at a HW before,
inside or after the range; the target table dropped or its checkpoint removed by hand; a
quarantine record. Events are written as the tail writes them (files named by the flush's
start, events between it and the next commit) and schema versions as it records them.

A mutation check: a survey that also calls a table with events quiet must fail this test
(``test_a_survey_that_skips_events_is_caught``).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine import apply_run
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.apply_survey import Survey
from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.events import DELETE, INSERT, SNAPSHOT, UPDATE, Event, events_to_arrow
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.quarantine import quarantine_table
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.schema_history import as_stored
from airflow_provider_dblog.engine.store import log_segment_name
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.wiring import Wiring

from helpers import POSTGRES_PORT, REDIS_PORT, drop_pg_database, unique

SOURCE, DB, FLUSHES, STEP = "src", "db", 8, 100
# timings, and a lake table's URI (each twin has its own directory)
NOT_COMPARED = {"seconds", "via", "read_s", "stage_s", "merge_s", "rows_per_s", "spark_s", "uri"}


def commit(i: int) -> Position:   # the tail's i-th checkpoint: where flush i starts
    return Position(1, STEP * (i + 1), 0)


def shape(name: str, second: str | None) -> TableSchema:
    cols = [Column("id", "int64", False), Column("v", "int64", True)]
    if second == "add":
        cols.append(Column("c1", "int64", True))
    elif second == "case":   # a lake table cannot hold two columns alike but for case
        cols += [Column("c1", "int64", True), Column("C1", "int64", True)]
    return TableSchema(DB, name, tuple(cols), ("id",))


@dataclass(frozen=True)
class TablePlan:
    events: tuple          # (flush, offset in it 0..99, key, op)
    second: str | None     # None | "add" | "case" | "ignore": a second version
    second_at: tuple       # (flush, offset) of the second version
    zombie: bool           # a zombie tail's copy of the table's last file
    snapshot: int | None   # a snapshot file at the HW (flush, 50)
    hand: str              # "" | "drop_table" | "drop_checkpoint" (after the first run)
    quarantined: bool


@st.composite
def situations(draw, lake: bool):
    a = draw(st.integers(1, FLUSHES - 1))
    f = draw(st.integers(a, FLUSHES))
    tables = []
    for _ in range(draw(st.integers(2, 5))):
        events = draw(st.lists(st.tuples(st.integers(0, f - 1), st.sampled_from([0, 1, 50, 98, 99]),
                                         st.integers(1, 4), st.sampled_from([INSERT, UPDATE, DELETE])),
                               max_size=6, unique_by=lambda e: (e[0], e[1])))
        second = draw(st.sampled_from([None, None, "add", "ignore"] + (["case"] if lake else [])))
        at = draw(st.sampled_from([(a - 1, 50), (a, 0), (a, 1), (f - 1, 99), (f, 0), (min(f, FLUSHES) + 1, 0)]))
        tables.append(TablePlan(tuple(sorted(events)), second, at, draw(st.booleans()),
                                draw(st.none() | st.integers(0, FLUSHES)),
                                draw(st.sampled_from(["", "", "", "drop_table", "drop_checkpoint"])),
                                draw(st.integers(0, 9)) == 0))
    return a, f, tables


def _version(plan: TablePlan, name: str, pos: Position) -> TableSchema:
    second = plan.second if plan.second and pos >= Position(1, *_off(plan.second_at)) else None
    return shape(name, "add" if second == "ignore" else second)


def _off(spot: tuple) -> tuple[int, int]:
    flush, offset = spot
    return commit(flush).offset + offset, 0


def write_flushes(store, names: list[str], plans: list[TablePlan], lo: int, hi: int) -> None:
    """Flushes ``lo``..``hi - 1`` as the tail writes them: versions first, then files."""
    for name, plan in zip(names, plans):
        at = Position(1, *_off(plan.second_at))
        # the first writes stop at the first run's frontier (a version there included); the
        # second write the rest, a version past the checkpoint too (written before its events)
        if plan.second is not None and (at <= commit(hi) if lo == 0 else at > commit(lo)):
            version = {"schema": _version(plan, name, at).to_dict()}
            if plan.second == "ignore":
                version["behaviour"] = "ignore"
            store.write_schema_version(f"{DB}.{name}", at, as_stored(version))
        last = None
        for flush in range(lo, hi):
            events = [Event(f"{DB}.{name}", op, (key,), None if op == INSERT else {"id": key, "v": 0},
                            None if op == DELETE else _image(plan, name, key, pos), pos)
                      for fl, off, key, op in plan.events if fl == flush
                      for pos in [Position(1, commit(fl).offset + off, 0)]]
            # one schema per file: the shape holding at the flush's start (a version inside a
            # flush starts a new file part, as the tail does)
            parts: dict[TableSchema, list[Event]] = {}
            for e in events:
                parts.setdefault(_version(plan, name, e.pos), []).append(e)
            for n, (schema, evs) in enumerate(sorted(parts.items(), key=lambda kv: kv[1][0].pos)):
                store.write_log_segment(schema, commit(flush), evs, "1", n)
                last = (schema, flush, evs, n)
            if plan.snapshot == flush:
                hw = Position(1, commit(flush).offset + 50, 5)
                schema = _version(plan, name, hw)
                rows = [Event(f"{DB}.{name}", SNAPSHOT, (k,), None, _image(plan, name, k, hw), hw.with_seq(6 + i))
                        for i, k in enumerate((7, 8))]
                store.write_snapshot(schema, hw, events_to_arrow(schema, rows))
        if plan.zombie and last is not None:
            schema, flush, evs, n = last
            path = f"{store.table_dir(f'{DB}.{name}')}/{log_segment_name(commit(flush), '2', n)}"
            store._write_atomic(path, events_to_arrow(schema, evs))


def _image(plan: TablePlan, name: str, key: int, pos: Position) -> dict:
    row = {"id": key, "v": pos.offset}
    return row | {c: pos.offset + 1 for c in _version(plan, name, pos).column_names if c not in row}


@pytest.fixture(scope="module")
def pg_database(servers):
    name = unique("survey")
    yield name
    drop_pg_database(name)


def _config(tmp_path, lake: bool, names: list[str], database: str):
    prefix = f"survey_{uuid.uuid4().hex[:8]}"

    def target(n: str) -> dict:
        if lake:
            return {"kind": "delta", "source": SOURCE, "path": str(tmp_path / prefix / n)}
        return {"kind": "postgres", "source": SOURCE, "host": "127.0.0.1", "port": POSTGRES_PORT,
                "user": "postgres", "database": database, "schema": f"{prefix}_{n}"}
    raw = {"sources": {SOURCE: {"kind": "mysql", "host": "127.0.0.1", "port": 1, "user": "u",
                                "tables": [f"{DB}.{n}" for n in names]}},
           "targets": {"x": target("x"), "y": target("y")},
           "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": prefix},
           "storage": {"root": str(tmp_path / prefix / "store")}}
    path = tmp_path / f"{prefix}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _checkpoint(state, pos: Position) -> None:
    token = state.acquire_lease("test", 30)
    state.commit(token, pos, {}, [], 0)
    state.release_lease(token)


def _without_survey(target, store, state, source_name, tables) -> Survey:
    return Survey(state.frontier())


def _seen(target, names: list[str], schemas: dict) -> dict:
    out = {}
    for n in names:
        t = f"{DB}.{n}"
        rows = None
        if target.exists(t):
            have = target.columns(t)
            cols = tuple(c for c in schemas[t].columns if c.name in have)
            read = TableSchema(DB, n, cols, ("id",))
            rows = sorted((tuple(sorted(r.items())) for r in target.rows(read, with_pos=True)))
        out[t] = {"exists": target.exists(t), "applied": target.applied_pos(SOURCE, t),
                  "columns": sorted(target.columns(t)), "rows": rows}
    return out


def _results(res: dict, name: str) -> dict:
    """Per table, what a run says (messages name their target: the twin's name left out)."""
    said = {t: {k: v for k, v in r.items() if k not in NOT_COMPARED} for t, r in res["tables"].items()}
    return json.loads(json.dumps(said).replace(f"target {name}", "target T"))


def run_twins(tmp_path, database: str, lake: bool, a: int, f: int, plans: list[TablePlan]):
    names = [f"t{i}" for i in range(len(plans))]
    cfg = _config(tmp_path, lake, names, database)
    parts = Wiring(cfg, SOURCE)
    state, store = parts.state, parts.store
    schemas = {f"{DB}.{n}": shape(n, "add" if p.second in ("add", "ignore") else p.second) for n, p in zip(names, plans)}
    try:
        for n in names:   # the tail's first version, at its first checkpoint
            store.write_schema_version(f"{DB}.{n}", commit(0), as_stored({"schema": shape(n, None).to_dict()}))
        write_flushes(store, names, plans, 0, a)
        _checkpoint(state, commit(a))
        for t in ("x", "y"):
            run_apply(cfg, t, via="local", schemas=schemas)
        write_flushes(store, names, plans, a, f)
        _checkpoint(state, commit(f))
        for n, plan in zip(names, plans):
            if plan.quarantined:
                quarantine_table(state, f"{DB}.{n}", commit(a), "a test's break")
            for t in ("x", "y"):
                target = open_target(cfg.target(t))
                try:
                    if plan.hand == "drop_table" and target.exists(f"{DB}.{n}"):
                        target.drop_table(shape(n, None)) if lake else _pg_drop(target, n)
                    elif plan.hand == "drop_checkpoint":
                        target.reset_applied(SOURCE, f"{DB}.{n}")
                finally:
                    target.close()
        found: list[Survey] = []
        with pytest.MonkeyPatch.context() as mp:
            real = apply_run.survey
            mp.setattr(apply_run, "survey", lambda *args: found.append(real(*args)) or found[-1])
            with_survey = run_apply(cfg, "x", via="local", schemas=schemas)
            mp.setattr(apply_run, "survey", _without_survey)
            without = run_apply(cfg, "y", via="local", schemas=schemas)
        x, y = open_target(cfg.target("x")), open_target(cfg.target("y"))
        try:
            seen_x, seen_y = _seen(x, names, schemas), _seen(y, names, schemas)
        finally:
            x.close()
            y.close()
        return _results(with_survey, "x"), _results(without, "y"), seen_x, seen_y, found[0].quiet
    finally:
        state.reset()


def _pg_drop(target, name: str) -> None:
    with target.conn, target.conn.cursor() as cur:
        cur.execute(f'DROP TABLE "{target.schema}"."{DB}__{name}"')


def twins_agree(tmp_path, database: str, lake: bool, situation) -> None:
    a, f, plans = situation
    got, want, seen_x, seen_y, quiet = run_twins(tmp_path, database, lake, a, f, plans)
    event(f"quiet tables: {len(quiet)} of {len(plans)}")
    note(f"with the survey: {got}; quiet: {quiet}")
    assert got == want
    assert seen_x == seen_y


SLOW_OK = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(max_examples=40, **SLOW_OK)
@given(situations(lake=False))
def test_a_run_with_the_survey_does_what_one_without_it_does_postgres(tmp_path, pg_database, situation):
    twins_agree(tmp_path, pg_database, False, situation)


@settings(max_examples=8, **SLOW_OK)   # (fewer on Delta: each commit writes files and a log entry)
@given(situations(lake=True))
def test_a_run_with_the_survey_does_what_one_without_it_does_delta(tmp_path, pg_database, situation):
    twins_agree(tmp_path, pg_database, True, situation)


def test_a_survey_that_skips_events_is_caught(tmp_path, pg_database):
    """The comparison can fail: a survey that calls a table with events in its range quiet
    leaves the twin targets apart."""
    from airflow_provider_dblog.engine import apply_survey

    def blind(target, store, state, source_name, tables):   # (the mutation: every table with a checkpoint)
        found = Survey(state.frontier())
        for t, (there, applied) in apply_survey.checkpoints(target, source_name, tables).items():
            if there and applied is not None and applied < found.frontier:
                found.quiet[t], found.applied[t] = apply_survey.EMPTY, applied
        return found
    plans = [TablePlan(((0, 1, 1, INSERT), (2, 5, 2, INSERT)), None, (0, 0), False, None, "", False)]
    got, want, seen_x, seen_y, _ = run_twins(tmp_path, pg_database, False, 1, 3, plans)
    assert got == want and seen_x == seen_y   # the real survey: the same
    with pytest.MonkeyPatch.context() as mp:   # the mutation on x's run (y's runs without a survey)
        mp.setattr(apply_run, "survey", blind)
        got, want, seen_x, seen_y, _ = run_twins(tmp_path, pg_database, False, 1, 3, plans)
    assert seen_x != seen_y and got != want


def test_the_survey_finds_the_quiet_tables(tmp_path, pg_database):
    """Which tables the survey calls quiet: none of those with something to do."""
    plain = dict(second=None, second_at=(0, 50), zombie=False, snapshot=None, hand="", quarantined=False)
    plans = [TablePlan(((0, 1, 1, INSERT),), **plain),                       # events before A only: empty
             TablePlan(((0, 1, 1, INSERT), (2, 0, 1, UPDATE)), **plain),     # an event at F - 1 flush: applied
             TablePlan((), **plain | {"zombie": True, "snapshot": 0}),       # a snapshot before A: empty
             TablePlan((), **plain | {"snapshot": 2}),                       # a snapshot in the range
             TablePlan((), **plain | {"second": "add", "second_at": (3, 0)}),  # a change at F
             TablePlan((), **plain | {"hand": "drop_checkpoint"}),
             TablePlan((), **plain | {"quarantined": True})]
    got, want, seen_x, seen_y, quiet = run_twins(tmp_path, pg_database, False, 1, 3, plans)
    assert got == want and seen_x == seen_y
    assert quiet == {"db.t0": "empty", "db.t2": "empty"}, quiet
    assert got["db.t1"]["events"] == 1 and got["db.t3"]["events"] == 2 and got["db.t4"].get("evolved")
