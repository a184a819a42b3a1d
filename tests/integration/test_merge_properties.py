"""The engine's own merge, on each target kind (a real PostgreSQL, a Delta table, an
Iceberg table with its catalog in the real PostgreSQL), against the model target of
tests/sim.py.

Hypothesis draws transactions on one of sim's tables (inserts, updates, deletes,
re-inserts, primary-key moves logged as the sources log them: a delete of the old key
and an insert of the new one), with apply runs in between. Each run takes the events
``applied <= pos < frontier`` as the real apply does (``sim.Target.apply_up_to`` picks
the same batch for the model) and drives the engine's functions the in-process apply
uses: ``apply_plan.latest_per_key`` -> ``apply_batch.flatten`` ->
``apply_batch.stage_and_merge`` (the target's ``merge_batch``: ``COPY`` into a stage table
and ``PostgresTarget.merge_from_stage``; delta-rs's MERGE; the Iceberg copy-on-write
snapshot). After each run:

* the target's rows and ``_dblog_pos`` equal the model's, its checkpoint the frontier;
* the last batch, and an older one, merged again change nothing (the merge ignores stage
  rows below the checkpoint, and never moves the checkpoint back);
* the last batch merged again with the checkpoint rewound to the batch's start (as if
  the checkpoint had not moved) changes nothing either: each key's row is already at its
  latest event, which the merge's per-row position guard leaves alone.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.apply_batch import flatten, stage_and_merge
from airflow_provider_dblog.engine.apply_plan import Batch, latest_per_key
from airflow_provider_dblog.engine.config import Endpoint, TargetConfig
from airflow_provider_dblog.engine.events import Event, events_to_arrow
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import TableSchema
from airflow_provider_dblog.engine.targets import PostgresTarget, open_target
from airflow_provider_dblog.engine.targets.pg_tables import POS_COLUMN

from helpers import POSTGRES_PORT, drop_pg_database, unique
from sim import SCHEMAS, SimSource, Target
from test_reconcile_properties import KEYS

SOURCE = "src"


@dataclass(frozen=True)
class Program:
    schema: str  # a table of sim.SCHEMAS
    steps: tuple  # ("txn", ((op, key[, new_key]), ...)) | ("apply", older): an apply run


@st.composite
def programs(draw) -> Program:
    schema = draw(st.sampled_from(sorted(KEYS)))
    keys = KEYS[schema]
    write = st.one_of(st.tuples(st.just("put"), keys), st.tuples(st.just("put"), keys),
                      st.tuples(st.just("delete"), keys), st.tuples(st.just("move"), keys, keys))
    txn = st.tuples(st.just("txn"), st.lists(write, min_size=1, max_size=4).map(tuple))
    apply = st.tuples(st.just("apply"), st.integers(0, 1000))  # which older batch to replay
    steps = draw(st.lists(st.one_of(txn, txn, apply), min_size=1, max_size=16))
    return Program(schema, tuple(steps) + (("apply", 0),))


def target_state(target: PostgresTarget, table: TableSchema) -> dict:
    return {tuple(r[k] for k in table.key): ({c: r[c] for c in table.column_names}, r[POS_COLUMN])
            for r in target.rows(table, with_pos=True)}


def model_state(model: Target) -> dict:
    return {k: (row, model.positions[k].encode()) for k, row in model.rows.items()}


def merge(target: PostgresTarget, table: TableSchema, events: list[Event], frontier: Position) -> dict:
    """One batch through the engine's in-process apply path: latest per key, flatten, stage, merge."""
    batch = Batch(table, target.applied_pos(SOURCE, table), frontier, events=len(events))
    flat = flatten(table, latest_per_key(events_to_arrow(table, events)))
    return stage_and_merge(target, batch, flat, SOURCE, uuid.uuid4().hex[:8], time.monotonic())


def unchanged(target: PostgresTarget, table: TableSchema, result: dict, before: dict, checkpoint: Position,
              what: str) -> None:
    assert (result["inserted"], result["updated"], result["deleted"]) == (0, 0, 0), (what, result)
    assert target_state(target, table) == before, what
    assert target.applied_pos(SOURCE, table) == checkpoint, what


@pytest.fixture(scope="module")
def pg_target_endpoint(servers):
    endpoint = Endpoint("127.0.0.1", POSTGRES_PORT, "postgres", "", unique("merge"))
    yield endpoint
    drop_pg_database(endpoint.database)


@pytest.fixture(scope="module", params=["postgres", "delta", "iceberg"])
def new_target(request, pg_target_endpoint, tmp_path_factory):
    """A fresh, empty target of the kind for each example (its own schema / directory / namespace)."""
    kind, root = request.param, tmp_path_factory.mktemp("lake")

    def make():
        name = f"s_{uuid.uuid4().hex[:8]}"
        return open_target(TargetConfig(kind, kind, None if kind == "delta" else pg_target_endpoint, SOURCE,
                                        name, path=str(root / name)))
    return make


def _drop(target) -> None:
    if target.config.kind == "postgres":
        with target.conn, target.conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
    else:
        target.drop_all()
    target.close()


# fewer examples on the lake kinds: each of their commits writes files and metadata
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_the_merge_matches_the_model_and_replays_change_nothing(new_target, program: Program) -> None:
    table = SCHEMAS[program.schema]
    sim = SimSource([table])
    model = Target(table)
    target = new_target()
    batches: list[tuple[list[Event], Position]] = []  # each run's batch and frontier
    try:
        target.ensure_table(table)
        for step in program.steps:
            if step[0] == "txn":
                sim.commit([(w[0], table, *w[1:]) for w in step[1]])
                continue
            frontier = sim.head()  # a tail that has read everything checkpoints here
            if model.applied is not None and frontier <= model.applied:
                continue  # nothing new: the real apply reports up_to_date
            start = model.applied
            batch = model.apply_up_to(sim.events(table), frontier)
            note(f"run {len(batches)}: {[(e.op, e.key, e.pos.encode()) for e in batch]}")
            if batch:
                merge(target, table, batch, frontier)
            else:  # an empty range: plan_table only moves the checkpoint
                target.advance_applied(SOURCE, table, frontier)
            batches.append((batch, frontier))
            state = target_state(target, table)
            assert state == model_state(model)
            assert target.applied_pos(SOURCE, table) == frontier
            # replays below the checkpoint: the last batch, and an older one
            older, older_frontier = batches[step[1] % len(batches)]
            for events, at, what in ((batch, frontier, "last batch again"),
                                     (older, older_frontier, "an older batch again")):
                if events:
                    unchanged(target, table, merge(target, table, events, at), state, frontier, what)
            # the last batch again as if its checkpoint had not moved: the position guard
            if batch:
                target.reset_applied(SOURCE, table)
                if start is not None:
                    target.advance_applied(SOURCE, table, start)
                unchanged(target, table, merge(target, table, batch, frontier), state, frontier,
                          "last batch again from its start")
    finally:
        _drop(target)
