"""ApplyReadyTrigger (the event-driven apply DAG's AssetWatcher) against the real Redis and
PostgreSQL target, and the factory's ``apply_schedule`` option.

The tail's side is played by ``RedisState.commit`` (what the tail calls after each flush),
the apply's by ``advance_applied`` on the real target.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.triggers.apply_ready import ApplyReadyTrigger

from helpers import first_event_while_ticking

P = Position
DAGS = Path(__file__).resolve().parents[2] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))


@pytest.fixture
def setup(dblog_setup):
    return dblog_setup({"items": "id INT PRIMARY KEY, v VARCHAR(20)", "other": "id INT PRIMARY KEY"})


@pytest.fixture
def target(setup):
    t = setup.target()
    yield t
    t.close()


@pytest.fixture
def tail(setup):
    """``commit(pos, n_events)``: a tail's checkpoint after a flush of ``n_events``."""
    state = setup.state()
    token = state.acquire_lease("test-tail", 60)
    yield lambda pos, n=1: state.commit(token, pos, {}, [], n)
    state.release_lease(token)


def trigger_for(setup, **kw) -> ApplyReadyTrigger:
    kw.setdefault("poll_interval", 0.05)
    return ApplyReadyTrigger(config_path=str(setup.path), target="tgt", **kw)


async def events(trigger, n: int, within: float) -> list[tuple[float, dict]]:
    """The trigger's first ``n`` events (seconds since the start, payload), or fewer if
    ``within`` seconds pass first."""
    out: list[tuple[float, dict]] = []
    gen = trigger.run()
    t0 = time.monotonic()

    async def collect():
        async for e in gen:
            out.append((time.monotonic() - t0, e.payload))
            if len(out) == n:
                return
    try:
        await asyncio.wait_for(collect(), within)
    except TimeoutError:
        pass
    finally:
        await gen.aclose()
    return out


def test_serializes_round_trip_and_stays_the_same_watcher_across_parses(setup):
    from airflow.triggers.base import BaseEventTrigger

    classpath, kwargs = trigger_for(setup, refire_seconds=30).serialize()
    assert classpath == "airflow_provider_dblog.triggers.apply_ready.ApplyReadyTrigger"
    again = ApplyReadyTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {"config_path": str(setup.path), "target": "tgt", "poll_interval": 0.05,
                      "refire_seconds": 30.0}
    # no clock or secret in the kwargs: a re-parse finds the same watcher
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(*trigger_for(setup, refire_seconds=30)
                                                                           .serialize())


def test_fires_when_the_checkpoint_is_past_the_target_without_blocking_the_loop(setup, tail):
    tail(P(1, 100, 0))   # nothing applied yet: behind

    async def nothing():
        pass
    payload, waited, ticks = first_event_while_ticking(trigger_for(setup), nothing)
    assert payload["frontier"] == P(1, 100, 0).encode() and payload["applied"] is None, payload
    assert (payload["source"], payload["target"]) == ("src", "tgt")
    assert waited < 5 and ticks >= 0.5 * waited / 0.01, (waited, ticks)


def test_does_not_fire_when_caught_up_and_fires_at_once_for_new_events(setup, target, tail):
    items, other = setup.tables
    tail(P(1, 100, 0))
    for t in (items, other):
        target.advance_applied("src", t, P(1, 100, 0))

    async def scenario():
        trig = trigger_for(setup, refire_seconds=0.2)
        assert await events(trig, 1, within=1.0) == []   # caught up: silent, refire or not

        async def commit_later():
            await asyncio.sleep(0.5)
            await asyncio.to_thread(tail, P(1, 200, 0))
        later = asyncio.create_task(commit_later())
        got = await events(trig, 1, within=10)
        await later
        return got
    got = asyncio.run(scenario())
    assert len(got) == 1 and got[0][0] >= 0.5, got
    assert got[0][1]["frontier"] == P(1, 200, 0).encode() and got[0][1]["applied"] == P(1, 100, 0).encode()


def test_one_event_per_apply_run_then_at_once_when_the_target_moved_and_refire_after_refire_seconds(
        setup, target, tail):
    """Commits while the first event's run has not moved the target add no event (that run, or
    the one after it, takes them); the moment the target moves and is still behind, the next
    event fires; with the target not moving at all, the trigger says so again after
    ``refire_seconds`` (a failed run is retried)."""
    items, other = setup.tables
    tail(P(1, 100, 0))

    async def scenario():
        trig = trigger_for(setup, refire_seconds=4)
        queue: asyncio.Queue = asyncio.Queue()
        t0, got = time.monotonic(), []

        async def collect():   # (a timeout must not cancel the generator itself)
            async for e in trig.run():
                await queue.put(e.payload)
        collector = asyncio.create_task(collect())

        async def next_event(within: float):
            try:
                payload = await asyncio.wait_for(queue.get(), within)
            except TimeoutError:
                return None
            got.append((time.monotonic() - t0, payload))
            return payload
        try:
            first = await next_event(5)
            for n in range(3):   # three flushes while the run is pending: nothing
                await asyncio.to_thread(tail, P(1, 200 + n, 0))
            quiet = await next_event(1.5)
            for t in (items, other):   # the run applied up to the frontier it read
                await asyncio.to_thread(target.advance_applied, "src", t, P(1, 100, 0))
            moved = await next_event(5)
            moved_at = time.monotonic() - t0
            again = await next_event(10)   # the target stays put: after refire_seconds
            return first, quiet, moved, moved_at, again, got
        finally:
            collector.cancel()
    first, quiet, moved, moved_at, again, got = asyncio.run(scenario())
    assert first["frontier"] == P(1, 100, 0).encode() and first["applied"] is None, got
    assert quiet is None, got
    assert moved["frontier"] == P(1, 202, 0).encode() and moved["applied"] == P(1, 100, 0).encode(), got
    assert again is not None and got[-1][0] - moved_at >= 4 - 0.5, got


def test_an_open_dump_window_holds_the_frontier_back(setup, target, tail):
    """An apply takes nothing at or above an open window's floor: no event for events above it."""
    items, other = setup.tables
    tail(P(1, 100, 0))
    for t in (items, other):
        target.advance_applied("src", t, P(1, 100, 0))
    setup.state().open_window("req", items, P(1, 100, 0))
    tail(P(1, 300, 0), 5)
    assert asyncio.run(events(trigger_for(setup, refire_seconds=0.2), 1, within=1.5)) == []


# -- the factory's apply_schedule -------------------------------------------------------
def factory_config(tmp_path, **airflow) -> str:
    cfg = {"sources": {"a": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["d.t1"]}},
           "targets": {"wh": {"kind": "postgres", "source": "a", "host": "h", "port": 2, "user": "u"}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": str(tmp_path)}}
    if airflow:
        cfg["airflow"] = airflow
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_the_apply_dag_is_event_driven_by_default_on_its_watcher_asset(tmp_path):
    from dblog_factory import build_dags
    path = factory_config(tmp_path)
    apply = build_dags(path)["dblog_apply__wh"]
    assert apply.max_active_runs == 1
    (asset,) = apply.timetable.asset_condition.objects
    assert (asset.uri, asset.name) == ("dblog-ready://wh/", "dblog.ready.wh")
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, ApplyReadyTrigger)
    assert watcher.trigger.serialize()[1]["config_path"] == path and watcher.trigger.target == "wh"


@pytest.mark.parametrize("schedule, timetable", [("*/2 * * * *", "Cron"), ("@hourly", "Cron"),
                                                 (None, "NullTimetable")])
def test_a_cron_schedule_or_none_is_kept(tmp_path, schedule, timetable):
    from dblog_factory import build_dags
    apply = build_dags(factory_config(tmp_path, apply_schedule=schedule))["dblog_apply__wh"]
    assert type(apply.timetable).__name__.startswith(timetable), type(apply.timetable)


@pytest.mark.parametrize("bad", ["events", "every 2 minutes", "*/2 * * *", 5])
def test_a_bad_apply_schedule_is_refused_with_what_is_allowed(tmp_path, bad):
    from dblog_factory import build_dags
    with pytest.raises(ValueError, match="apply_schedule must be 'event'.*cron expression"):
        build_dags(factory_config(tmp_path, apply_schedule=bad))
