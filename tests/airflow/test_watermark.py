"""HighWatermarkTrigger and DBLogHighWatermarkSensor against a real Redis.

The tail's side is played by ``RedisState.commit`` with a lease token, exactly the
call the log tail makes when it acknowledges a flush with the watermarks it saw.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.module_loading import import_string

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.exceptions import DBLogWindowFailed
from airflow_provider_dblog.sensors.watermark import DBLogHighWatermarkSensor
from airflow_provider_dblog.triggers.watermark import HighWatermarkTrigger

from helpers import first_event, first_event_while_ticking

P = Position


@pytest.fixture
def setup(dblog_setup):
    return dblog_setup({"t": "id INT PRIMARY KEY, v INT"})


@pytest.fixture
def tail(setup):
    """The tail's side: a lease and a first checkpoint at (1, 4)."""
    state = setup.state()
    token = state.acquire_lease("test-tail", 30)
    state.commit(token, P(1, 4), {"file": "x", "pos": 4}, [], 0)

    def commit(pos: Position, watermarks: list[tuple[str, Position]]) -> None:
        state.commit(token, pos, {"file": "x", "pos": pos.offset}, watermarks, 0)
    return state, commit


def open_window(state, request: str = "r1", floor: Position = P(1, 4)):
    state.create_request({"id": request, "scope": "table", "tables": ["x.t"]})
    return state.open_window(request, "x.t", floor)


def trigger_for(setup, window, **kw) -> HighWatermarkTrigger:
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("timeout", 10)
    return HighWatermarkTrigger(config_path=str(setup.path), source="src",
                                window=json.loads(window.to_json()), **kw)



def redis_snapshot(setup) -> dict:
    """Every key of the test's prefix with its value: to prove the trigger writes nothing."""
    r = setup.state().r
    out = {}
    for k in sorted(r.scan_iter(match=f"{setup.config.state_prefix}:*")):
        t = r.type(k)
        out[k] = (t, r.hgetall(k) if t == "hash" else r.lrange(k, 0, -1) if t == "list"
                  else r.zrange(k, 0, -1, withscores=True) if t == "zset" else r.get(k))
    return out


# -- the trigger ----------------------------------------------------------------------
def test_trigger_serializes_without_secrets_and_rebuilds(setup, tail):
    state, _ = tail
    w = open_window(state)
    trig = trigger_for(setup, w, timeout=42.0)
    classpath, kwargs = trig.serialize()
    assert classpath == "airflow_provider_dblog.triggers.watermark.HighWatermarkTrigger"
    text = json.dumps(kwargs)  # plain JSON: storable as the trigger's kwargs
    assert "redis://" not in text and "password" not in text
    rebuilt = import_string(classpath)(**json.loads(text))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.window["id"] == w.id and rebuilt.timeout == 42.0
    assert rebuilt.started_at == trig.started_at  # the timeout does not start over on a restart


def test_trigger_fires_success_once_the_hw_is_committed_without_blocking_the_loop(setup, tail):
    state, commit = tail
    w = open_window(state)
    trig = trigger_for(setup, w)

    async def the_tail():
        await asyncio.sleep(0.3)
        await asyncio.to_thread(commit, P(1, 120), [(w.lw, P(1, 100))])   # LW alone: not yet
        await asyncio.sleep(0.3)
        await asyncio.to_thread(commit, P(1, 200), [(w.hw, P(1, 150))])   # now the HW

    event, waited, ticks = first_event_while_ticking(trig, the_tail)
    assert event["status"] == "success", event
    assert event["lw"] == P(1, 100).encode() and event["hw"] == P(1, 150).encode()
    assert event["window"] == w.id
    assert waited >= 0.55  # it fired only after the HW was committed
    assert ticks >= waited / 0.01 * 0.5, (ticks, waited)  # the loop was never blocked


def test_trigger_hw_before_lw_is_an_error(setup, tail):
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.hw, P(1, 100)), (w.lw, P(1, 150))])
    event = asyncio.run(first_event(trigger_for(setup, w)))
    assert event["status"] == "error" and "not after LW" in event["message"], event


def test_trigger_watermark_seen_twice_is_an_error(setup, tail):
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.lw, P(1, 100))])
    commit(P(1, 300), [(w.lw, P(1, 250))])  # the same LW again, elsewhere
    event = asyncio.run(first_event(trigger_for(setup, w)))
    assert event["status"] == "error" and "seen twice" in event["message"], event


def test_trigger_lw_before_the_window_opened_is_an_error(setup, tail):
    state, commit = tail
    w = open_window(state, floor=P(1, 500))
    commit(P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])
    event = asyncio.run(first_event(trigger_for(setup, w)))
    assert event["status"] == "error" and "before the window opened" in event["message"], event


def test_trigger_window_closed_meanwhile_is_an_error(setup, tail):
    state, _ = tail
    w = open_window(state)
    state.close_window(w, "abandoned")
    event = asyncio.run(first_event(trigger_for(setup, w)))
    assert event["status"] == "error" and "was closed" in event["message"], event


def test_trigger_times_out_and_writes_nothing(setup, tail):
    state, commit = tail
    w = open_window(state)
    commit(P(1, 120), [(w.lw, P(1, 100))])  # the LW only: the HW never comes
    before = redis_snapshot(setup)
    t0 = time.monotonic()
    event = asyncio.run(first_event(trigger_for(setup, w, timeout=0.6)))
    assert 0.5 <= time.monotonic() - t0 < 5
    assert event["status"] == "timeout", event
    assert "Is the log tail running?" in event["message"] and "LW seen: True, HW seen: False" in event["message"]
    assert redis_snapshot(setup) == before


def test_trigger_never_connects_to_the_source(setup, tail, monkeypatch):
    import pymysql

    def refuse(*a, **kw):
        raise AssertionError("the trigger connected to the source database")
    monkeypatch.setattr(pymysql, "connect", refuse)
    monkeypatch.setattr(pymysql, "Connect", refuse)
    monkeypatch.setattr(pymysql.connections.Connection, "connect", refuse)
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])
    event = asyncio.run(first_event(trigger_for(setup, w)))
    assert event["status"] == "success", event


def test_trigger_resolves_a_state_connection_with_async_access(setup, tail, tmp_path, monkeypatch):
    """state: {conn_id: ...}: the Redis URL comes from an Airflow connection, looked up
    with the Task SDK's async access in the triggerer (not from the trigger's kwargs)."""
    import yaml
    from airflow.sdk import BaseHook, Connection

    from helpers import REDIS_PORT

    raw = yaml.safe_load(setup.path.read_text())
    raw["state"] = {"conn_id": "dblog_state_test", "prefix": raw["state"]["prefix"]}
    path = tmp_path / "with_conn.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("AIRFLOW_CONN_DBLOG_STATE_TEST", raising=False)
    asked = []

    async def aget_connection(conn_id):
        asked.append(conn_id)
        return Connection(conn_id=conn_id, conn_type="redis", host="127.0.0.1", port=REDIS_PORT, schema="0")
    monkeypatch.setattr(BaseHook, "aget_connection", aget_connection)
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])
    trig = HighWatermarkTrigger(config_path=str(path), source="src", window=json.loads(w.to_json()),
                                poll_interval=0.05, timeout=10)
    assert "redis://" not in json.dumps(trig.serialize()[1])
    event = asyncio.run(first_event(trig))
    assert asked == ["dblog_state_test"]
    assert event["status"] == "success", event


def test_trigger_unreadable_config_is_an_error(setup, tail, tmp_path):
    state, _ = tail
    w = open_window(state)
    trig = HighWatermarkTrigger(config_path=str(tmp_path / "missing.yaml"), source="src",
                                window=json.loads(w.to_json()), poll_interval=0.05, timeout=10)
    event = asyncio.run(first_event(trig))
    assert event["status"] == "error" and "missing.yaml" in event["message"], event


# -- the sensor -----------------------------------------------------------------------
def sensor_for(setup, window, **kw) -> DBLogHighWatermarkSensor:
    kw.setdefault("poll_interval", 0.05)
    return DBLogHighWatermarkSensor(task_id="wait_hw", config_path=str(setup.path), source="src",
                                    window=window, **kw)


def chunk_xcom(window) -> dict:
    return {"chunk": {"request": window.request, "table": window.table, "predicates": ["1=1"],
                      "keys": None, "end": "[1]", "last": False},
            "window": json.loads(window.to_json()), "selected": 1}


def test_sensor_defers_while_the_hw_is_not_there(setup, tail, context):
    state, _ = tail
    w = open_window(state)
    sensor = sensor_for(setup, chunk_xcom(w), timeout=30)  # the chunk operator's whole XCom
    with pytest.raises(TaskDeferred) as d:
        sensor.execute(context)
    assert d.value.method_name == "execute_complete"
    trig = d.value.trigger
    assert isinstance(trig, HighWatermarkTrigger)
    assert trig.window["id"] == w.id and trig.timeout == 30 and trig.config_path == str(setup.path)
    assert d.value.timeout.total_seconds() > 30  # Airflow's own deferral timeout is only a backstop
    assert state.window_is_open(w.id)


def test_sensor_succeeds_at_once_when_the_hw_is_there(setup, tail, context):
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])
    # the window as a template renders it without native rendering: Python's repr of the dict
    out = sensor_for(setup, repr(json.loads(w.to_json()))).execute(context)
    assert out == {"window": w.id, "lw": P(1, 100).encode(), "hw": P(1, 150).encode()}
    assert state.window_is_open(w.id)  # the reconcile closes it, not the sensor


def test_sensor_fails_at_once_on_a_bad_window_and_closes_it(setup, tail, context):
    state, commit = tail
    w = open_window(state)
    commit(P(1, 200), [(w.hw, P(1, 100)), (w.lw, P(1, 150))])
    with pytest.raises(DBLogWindowFailed, match="not after LW"):
        sensor_for(setup, json.loads(w.to_json())).execute(context)
    assert not state.window_is_open(w.id)
    closed = json.loads(state.r.lindex(state.k("windows_closed"), 0))
    assert closed["id"] == w.id and closed["outcome"] == "failed"


def test_execute_complete_success_returns_the_positions(setup, tail, context):
    state, _ = tail
    w = open_window(state)
    out = sensor_for(setup, json.loads(w.to_json())).execute_complete(
        context, {"status": "success", "window": w.id, "lw": P(1, 100).encode(), "hw": P(1, 150).encode()})
    assert out == {"window": w.id, "lw": P(1, 100).encode(), "hw": P(1, 150).encode()}
    assert state.window_is_open(w.id)


@pytest.mark.parametrize("status,message", [
    ("error", "window w: HW (1, 100) is not after LW (1, 150)"),
    ("timeout", "window w did not close within 30s. Is the log tail running?"),
])
def test_execute_complete_error_closes_the_window_as_failed(setup, tail, context, status, message):
    state, _ = tail
    w = open_window(state)
    sensor = sensor_for(setup, chunk_xcom(w))
    with pytest.raises(DBLogWindowFailed) as e:
        sensor.execute_complete(context, {"status": status, "window": w.id, "message": message})
    assert message in str(e.value)
    assert not state.window_is_open(w.id)
    assert not any(x.id == w.id for x in state.open_windows())
    closed = json.loads(state.r.lindex(state.k("windows_closed"), 0))
    assert closed["id"] == w.id and closed["outcome"] == "failed" and message in closed["error"]
    req = state.request(w.request)
    assert req["status"] == "failed" and message in req["error"]
    assert state.frontier() == state.checkpoint().pos  # no longer held back by the window


def test_deferred_sensor_round_trip_through_the_trigger(setup, tail, context):
    """execute -> TaskDeferred -> the trigger's event -> execute_complete, as dag.test() runs it."""
    state, commit = tail
    w = open_window(state)
    sensor = sensor_for(setup, json.loads(w.to_json()))
    with pytest.raises(TaskDeferred) as d:
        sensor.execute(context)
    threading.Timer(0.3, commit, (P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])).start()
    event = asyncio.run(first_event(d.value.trigger))
    out = getattr(sensor, d.value.method_name)(context, event)
    assert out["hw"] == P(1, 150).encode()


def test_poke_mode_succeeds_when_the_hw_arrives(setup, tail, context):
    state, commit = tail
    w = open_window(state)
    threading.Timer(0.3, commit, (P(1, 200), [(w.lw, P(1, 100)), (w.hw, P(1, 150))])).start()
    out = sensor_for(setup, json.loads(w.to_json()), deferrable=False, timeout=10).execute(context)
    assert out["lw"] == P(1, 100).encode() and out["hw"] == P(1, 150).encode()


def test_poke_mode_timeout_closes_the_window_as_failed(setup, tail, context):
    state, _ = tail
    w = open_window(state)
    t0 = time.monotonic()
    with pytest.raises(DBLogWindowFailed, match="Is the log tail running"):
        sensor_for(setup, json.loads(w.to_json()), deferrable=False, timeout=0.5).execute(context)
    assert time.monotonic() - t0 < 5
    assert not state.window_is_open(w.id)


@pytest.mark.parametrize("reason", ["TRIGGER_TIMEOUT", "TRIGGER_FAILURE"])
def test_a_trigger_that_fails_or_hits_the_deferral_timeout_closes_the_window(setup, tail, context, reason):
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

    state, _ = tail
    w = open_window(state)
    sensor = sensor_for(setup, chunk_xcom(w))
    with pytest.raises(DBLogWindowFailed, match="triggerer"):
        sensor.resume_execution(TRIGGER_FAIL_REPR, {"error": TriggerFailureReason[reason]}, context)
    assert not state.window_is_open(w.id)
