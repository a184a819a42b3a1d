"""TargetLagTrigger and the deferrable DBLogLagSensor against a real target, Redis and source.

The apply's side is played by ``advance_applied`` on the real PostgreSQL target, the call
an apply makes for a batch; the tail's side by the tail operator itself.
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from airflow_provider_dblog.engine.lag import target_progress
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.exceptions import DBLogInvalidRequest
from airflow_provider_dblog.operators.tail import DBLogTailOperator
from airflow_provider_dblog.sensors.lag import DBLogLagSensor
from airflow_provider_dblog.triggers.lag import TargetLagTrigger

from helpers import first_event, first_event_while_ticking

P = Position
WANT = P(1, 5000, 0)


@pytest.fixture
def setup(dblog_setup):
    return dblog_setup({"items": "id INT PRIMARY KEY, v VARCHAR(20)", "other": "id INT PRIMARY KEY"})


@pytest.fixture
def target(setup):
    t = setup.target()
    yield t
    t.close()



def trigger_for(setup, **kw) -> TargetLagTrigger:
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("timeout", 20)
    return TargetLagTrigger(config_path=str(setup.path), target="tgt", **kw)


# -- the engine's reading ----------------------------------------------------------------
def test_target_progress_reads_every_table_and_names_unknown_ones(setup, target):
    items, other = setup.tables
    target.advance_applied("src", items, WANT)
    p = target_progress(setup.config, None)
    assert p.target == "tgt" and p.applied == {items: WANT, other: None}
    assert p.missing == [other] and p.behind(WANT) == [other]
    assert not p.reached(WANT) and not p.reached(max_lag_s=1e9)   # nothing known of `other`
    assert target_progress(setup.config, "tgt", [items]).reached(WANT)
    from airflow_provider_dblog.engine.errors import UnknownTableError
    with pytest.raises(UnknownTableError, match="not configured"):
        target_progress(setup.config, "tgt", ["x.nope"])


# -- the trigger ----------------------------------------------------------------------
def test_trigger_serializes_and_rebuilds(setup):
    trig = trigger_for(setup, tables=["a.b"], position=WANT.encode(), timeout=42.0)
    classpath, kwargs = trig.serialize()
    assert classpath == "airflow_provider_dblog.triggers.lag.TargetLagTrigger"
    again = TargetLagTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["started_at"] == trig.started_at and kwargs["tables"] == ["a.b"]
    with pytest.raises(ValueError, match="exactly one"):
        TargetLagTrigger(config_path="x", position=WANT.encode(), max_lag_seconds=3)


def test_trigger_fires_once_the_target_reaches_the_position_without_blocking_the_loop(setup, target):
    items, other = setup.tables
    trig = trigger_for(setup, position=WANT.encode())

    async def the_apply():
        await asyncio.sleep(0.3)
        await asyncio.to_thread(target.advance_applied, "src", items, WANT)   # one table: not yet
        await asyncio.sleep(0.3)
        await asyncio.to_thread(target.advance_applied, "src", other, P(1, 7000, 0))

    event, waited, ticks = first_event_while_ticking(trig, the_apply)
    assert event["status"] == "success", event
    assert event["applied"] == {items: WANT.encode(), other: P(1, 7000, 0).encode()}
    assert waited >= 0.55  # only after both tables were there
    assert ticks >= waited / 0.01 * 0.5, (ticks, waited)  # the loop was never blocked


def test_trigger_times_out_with_the_last_reading(setup, target):
    items, _ = setup.tables
    target.advance_applied("src", items, P(1, 10, 0))
    event = asyncio.run(first_event(trigger_for(setup, tables=[items], position=WANT.encode(), timeout=0.5)))
    assert event["status"] == "timeout"
    assert event["applied"] == {items: P(1, 10, 0).encode()}
    assert "did not reach position" in event["message"]


def test_trigger_unknown_table_or_config_is_an_error(setup, tmp_path):
    event = asyncio.run(first_event(trigger_for(setup, tables=["x.nope"], position=WANT.encode())))
    assert event["status"] == "error" and "not configured" in event["message"]
    missing = TargetLagTrigger(config_path=str(tmp_path / "none.yaml"), max_lag_seconds=5)
    event = asyncio.run(first_event(missing))
    assert event["status"] == "error" and "none.yaml" in event["message"]


def test_trigger_lag_in_seconds_against_the_tails_checkpoints(setup, target):
    """The lag goal through the trigger: the tail's checkpoint sample bounds the lag."""
    items, other = setup.tables
    ctx = {"ti": None}
    DBLogTailOperator(task_id="tail", config_path=str(setup.path), max_seconds=1).execute(ctx)
    cp = setup.state().checkpoint()
    setup.execute("INSERT INTO items VALUES (1, 'a')")  # the source's head moves past the checkpoint
    for t in (items, other):
        target.advance_applied("src", t, cp.pos)
    event = asyncio.run(first_event(trigger_for(setup, max_lag_seconds=3600)))
    assert event["status"] == "success" and 0 <= event["lag_s"] < 600
    strict = asyncio.run(first_event(trigger_for(setup, max_lag_seconds=0, timeout=0.3)))
    assert strict["status"] == "timeout" and strict["lag_s"] > 0


# -- the sensor -----------------------------------------------------------------------
def test_sensor_defers_while_behind_and_round_trips_through_the_trigger(setup, target, context):
    items, other = setup.tables
    sensor = DBLogLagSensor(task_id="lag", config_path=str(setup.path), position=WANT.encode(),
                            poke_interval=0.05, timeout=30)
    with pytest.raises(TaskDeferred) as d:
        sensor.execute(context)
    trig = d.value.trigger
    assert isinstance(trig, TargetLagTrigger) and trig.tables == [items, other]
    assert trig.timeout == 30 and d.value.method_name == "execute_complete"

    def catch_up():
        target.advance_applied("src", items, WANT)
        target.advance_applied("src", other, WANT)
    threading.Timer(0.3, catch_up).start()
    event = asyncio.run(first_event(trig))
    out = sensor.execute_complete(context, event)
    assert out["applied"] == {items: WANT.encode(), other: WANT.encode()}
    assert out["position"] == WANT.encode() and "status" not in out


def test_sensor_succeeds_at_once_when_caught_up(setup, target, context):
    items, _ = setup.tables
    target.advance_applied("src", items, WANT)
    sensor = DBLogLagSensor(task_id="lag", config_path=str(setup.path), table=items, position=WANT.encode())
    out = sensor.execute(context)  # no deferral
    assert out["applied"] == {items: WANT.encode()}


def test_sensor_bad_input_fails_before_deferring(setup, context):
    with pytest.raises(DBLogInvalidRequest, match="not configured"):
        DBLogLagSensor(task_id="lag", config_path=str(setup.path), table="x.y",
                       position=WANT.encode()).execute(context)
    with pytest.raises(DBLogInvalidRequest, match="unknown target|not configured|target"):
        DBLogLagSensor(task_id="lag", config_path=str(setup.path), target="nope",
                       position=WANT.encode()).execute(context)
    with pytest.raises(DBLogInvalidRequest, match="negative"):
        DBLogLagSensor(task_id="lag", config_path=str(setup.path), max_lag_seconds=-1).execute(context)


def test_execute_complete_timeout_and_error(setup, context):
    sensor = DBLogLagSensor(task_id="lag", config_path=str(setup.path), max_lag_seconds=5)
    with pytest.raises(AirflowSensorTimeout, match="did not reach"):
        sensor.execute_complete(context, {"status": "timeout", "message": "target tgt did not reach lag"})
    with pytest.raises(DBLogInvalidRequest, match="not configured"):
        sensor.execute_complete(context, {"status": "error", "message": "table 'x.y' is not configured"})


def test_poke_mode_still_works(setup, target, context):
    items, _ = setup.tables
    sensor = DBLogLagSensor(task_id="lag", config_path=str(setup.path), table=[items],
                            position=WANT.encode(), deferrable=False)
    assert sensor.poke(context).is_done is False
    target.advance_applied("src", items, WANT)
    assert sensor.poke(context).is_done is True
