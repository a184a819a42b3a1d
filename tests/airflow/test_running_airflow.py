"""What users see of dblog in a RUNNING Airflow (issue 14): the api-server, scheduler,
dag-processor and triggerer as separate processes (airflow_provider_dblog/devenv/running_airflow.py, the
``running_airflow`` fixture of tests/airflow/conftest.py), driven only through the REST API
v2 as a user's script or the UI would: forms submitted with their defaults, runs and their
states, task logs, XComs, Asset events, and a sensor deferred in the real triggerer.

The tests share one Airflow and one dblog set-up (tables ``items`` and ``chunked``, the
continuous tail DAG running through them, targets ``tgt`` and the Delta ``lake``) with
test_browser_forms.py, test_running_lake.py and test_running_verify.py, which run just before
and after them (tests/airflow/conftest.py, ``running_airflow``); each works on rows of its own
(here ids 1-100 and from 9001 of ``items``, and ``chunked``; the browser's ids 201-270 of
``items``, the lake's 5001-5100, the verification's 5201-5210).
"""
from __future__ import annotations

import pytest

from helpers import wait_until
from airflow_provider_dblog.devenv.running_airflow import wait_ti_state

TAIL = "dblog_tail__src"
APPLY = "dblog_apply__tgt"
REPAIR = "dblog_repair__src"
CONTROL = "dblog_dump_control__src"
CHUNK = "dblog_test_chunk"
CONSUMER = "dblog_test_consumer"
CHUNK_GROUP = ("select", "wait_hw", "reconcile")
REPAIR_TASKS = ("create_request", "dump", "apply__tgt", "apply__lake")  # a repair applies every target
RUN_TIMEOUT = 600  # a repair runs Spark (local[2]) on a loaded 2-core machine


def apply_now(d) -> str:
    """Let the tail read everything written so far, then run the apply DAG: its run id."""
    d.drain()
    run_id, state, tasks = d.api.run_dag(APPLY)
    assert (state, tasks) == ("success", {"apply": "success"}), (state, tasks)
    return run_id


def watermark_rows(d) -> list:
    with d.setup.sdb.cursor() as cur:
        cur.execute(f"SELECT value, updated_at FROM {d.setup.wm_ns}.watermark")
        return cur.fetchall()


def test_the_tail_runs_continuously_and_a_keys_repair_from_the_form_fixes_the_target(deployment):
    d, api = deployment, deployment.api
    d.setup.execute("INSERT INTO items SELECT seq, CONCAT('item', seq), seq / 4.0 FROM seq_1_to_100")
    apply_now(d)
    assert d.compare(d.items).equal

    d.damage_items(7, 8)
    assert not d.compare(d.items).equal

    # the form's defaults (scope "table", the first table, sizes from the config) plus the keys
    run_id, state, tasks = api.run_dag(REPAIR, {"scope": "keys", "keys": "7\n8"}, timeout=RUN_TIMEOUT)
    assert (state, tasks) == ("success", dict.fromkeys(REPAIR_TASKS, "success")), (state, tasks)
    request_id = api.xcom(REPAIR, run_id, "create_request")
    request = d.setup.state().request(request_id)
    assert request["status"] == "done" and request["spec"]["tables"] == [d.items], request
    assert request["spec"]["scope"] == "keys" and len(request["spec"]["keys"]) == 2, request
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()
    diff = d.compare(d.items, "lake")  # the repair's apply__lake: the log so far, the Delta table made if new
    assert diff.equal, diff.describe()

    # @continuous: a tail run ends after tail_run_seconds and the scheduler starts the next
    def ended_and_followed():
        runs = api.runs(TAIL)
        return any(r["state"] == "success" for r in runs) and any(r["state"] in ("queued", "running") for r in runs)
    wait_until(ended_and_followed, d.tail_run_seconds * 4, "a tail run succeeded and the next one started",
               poll=0.5)


@pytest.mark.parametrize("conf, words", [
    ({"scope": "keys", "keys": "abc"}, "not an integer"),
    ({"scope": "where", "where": "id = 1; DROP TABLE items"}, "unexpected ';'"),
], ids=["bad-key", "not-a-plain-condition"])
def test_a_bad_repair_fails_at_create_request_with_the_message_and_nothing_runs_after_it(deployment, conf,
                                                                                        words):
    d, api = deployment, deployment.api
    state = d.setup.state()
    requests_before, watermark_before = state.requests(100), watermark_rows(d)
    run_id, run_state, tasks = api.run_dag(REPAIR, conf, timeout=RUN_TIMEOUT)
    assert (run_state, tasks) == ("failed", {"create_request": "failed"} | dict.fromkeys(
        REPAIR_TASKS[1:], "upstream_failed")), (run_state, tasks)
    assert words in api.task_log(REPAIR, run_id, "create_request")
    assert state.requests(100) == requests_before
    assert watermark_rows(d) == watermark_before  # the source was not written to


@pytest.mark.parametrize("dag_id, conf, words", [
    (REPAIR, {"scope": "everything"}, "everything"),
    (CONTROL, {"action": "pause"}, "request_id"),
], ids=["repair-scope-outside-the-choices", "control-without-a-request-id"])
def test_the_form_refuses_a_run_its_params_do_not_allow(running_airflow, dag_id, conf, words):
    api = running_airflow.api
    api.set_paused(dag_id, False)
    runs_before = len(api.runs(dag_id))
    r = api.trigger_response(dag_id, conf)
    assert r.status_code == 400 and words in r.text, (r.status_code, r.text)
    assert len(api.runs(dag_id)) == runs_before


def test_an_apply_that_changed_a_table_adds_an_event_to_its_asset_and_one_that_changed_nothing_none(deployment):
    d, api = deployment, deployment.api
    api.set_paused(CONSUMER, False)
    d.setup.execute("INSERT INTO items VALUES (9001, 'a', 1), (9002, 'b', 2), (9003, 'c', 3)")
    apply_now(d)
    d.setup.execute("INSERT INTO items VALUES (9004, 'd', 4)")
    d.setup.execute("UPDATE items SET price = 10 WHERE id = 9001")
    d.setup.execute("DELETE FROM items WHERE id = 9002")
    changed = apply_now(d)

    events = api.asset_events(source_dag_id=APPLY, source_run_id=changed)
    db, table = d.items.split(".")
    assert [e["uri"] for e in events] == [f"dblog://src/{db}/{table}"], events
    extra = events[0]["extra"]
    assert (extra["inserted"], extra["updated"], extra["deleted"]) == (1, 1, 1), extra
    assert extra["target"] == "tgt" and extra["position"], extra

    # the DAG scheduled on the table's Asset runs for that event
    def consumer_run():
        event = api.asset_events(source_dag_id=APPLY, source_run_id=changed)[0]
        return next((r["run_id"] for r in event["created_dagruns"] if r["dag_id"] == CONSUMER), None)
    consumer_run_id = wait_until(consumer_run, 120, "a run of the Asset's consumer DAG", poll=0.5)
    assert api.wait_run(CONSUMER, consumer_run_id) == "success"

    unchanged = apply_now(d)
    assert api.asset_events(source_dag_id=APPLY, source_run_id=unchanged) == []


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_controlling_an_unknown_dump_request_fails_the_control_run(running_airflow, action):
    api = running_airflow.api
    run_id, state, tasks = api.run_dag(CONTROL, {"request_id": "no-such-request", "action": action})
    assert (state, tasks) == ("failed", {"control": "failed"}), (state, tasks)
    assert "unknown dump request 'no-such-request'" in api.task_log(CONTROL, run_id, "control")


def test_the_hw_sensor_defers_in_the_triggerer_until_the_tail_reads_the_window(deployment):
    """With the tail DAG paused (its last run ended), the chunk's HW cannot be in the log: the
    sensor defers, the triggerer holds its trigger; once the tail runs again the trigger
    fires and the sensor and the reconcile succeed."""
    d, api = deployment, deployment.api
    api.set_paused(TAIL, True)
    try:
        # (a run queued before the pause stays queued while the DAG is paused)
        wait_until(lambda: not [r for r in api.runs(TAIL) if r["state"] == "running"],
                   d.tail_run_seconds + 120, "the paused tail DAG's last run ended", poll=0.5)
        run_id = api.trigger(CHUNK)
        wait_ti_state(api, CHUNK, run_id, "wait_hw", "deferred", timeout=300,
                      refuse=("failed", "upstream_failed", "success", "skipped"))

        def held_by_the_triggerer():
            ti = api.task_instance(CHUNK, run_id, "wait_hw")
            assert ti["state"] == "deferred", ti["state"]
            trigger = ti["trigger"] or {}
            return trigger if trigger.get("triggerer_id") else None
        trigger = wait_until(held_by_the_triggerer, 60, "the triggerer took the HW trigger", poll=0.2)
        assert trigger["classpath"].endswith("HighWatermarkTrigger"), trigger
    finally:
        api.set_paused(TAIL, False)
    assert api.wait_run(CHUNK, run_id, timeout=300) == "success", api.task_states(CHUNK, run_id)
    assert api.task_states(CHUNK, run_id) == dict.fromkeys(("create_request", "chunk", "wait_hw", "reconcile"),
                                                           "success")
    assert api.xcom(CHUNK, run_id, "chunk")["selected"] == 3
    assert d.setup.state().request(api.xcom(CHUNK, run_id, "create_request"))["status"] == "done"


def test_the_shipped_dump_dag_runs_each_chunk_as_a_task_group_and_continues_in_a_next_run(deployment):
    """``dblog_dump__src__<db>__chunked`` with chunks of 20 rows (50 rows: three chunks) and two
    chunk groups per run: the first run does two chunks and triggers a second run with the
    request id; that run does the last chunk, skips its second group and ends the request."""
    d, api = deployment, deployment.api
    dag_id = "dblog_dump__src__" + d.chunked.replace(".", "__")
    first, state, tasks = api.run_dag(dag_id, {"chunk_size": 20}, timeout=RUN_TIMEOUT)
    assert state == "success", tasks
    groups = {f"chunk_0{i}.{step}": "success" for i in (1, 2) for step in CHUNK_GROUP}
    assert tasks == {"create_request": "success", **groups, "chunks_left": "success",
                     "next_run": "success"}, tasks
    request_id = api.xcom(dag_id, first, "create_request")
    assert d.setup.state().request(request_id)["status"] == "running"
    # each group's sensor saw its own chunk's window (with a running tail it is often in the log
    # before the sensor first looks: no deferral then; the deferral test below holds the tail)
    windows = [api.xcom(dag_id, first, f"chunk_0{i}.select")["window"]["id"] for i in (1, 2)]
    assert [api.xcom(dag_id, first, f"chunk_0{i}.wait_hw")["window"] for i in (1, 2)] == windows

    # the second run: triggered by next_run with the request id, noted as a continuation
    second = next(r for r in api.runs(dag_id) if r["dag_run_id"] != first)
    assert second["conf"] == {"request_id": request_id} and "continues" in (second.get("note") or ""), second
    assert api.wait_run(dag_id, second["dag_run_id"], timeout=RUN_TIMEOUT) == "success"
    tasks = api.task_states(dag_id, second["dag_run_id"])
    assert tasks == {"create_request": "success", **{f"chunk_01.{s}": "success" for s in CHUNK_GROUP},
                     **{f"chunk_02.{s}": "skipped" for s in CHUNK_GROUP}, "chunks_left": "success",
                     "next_run": "skipped"}, tasks
    assert api.xcom(dag_id, second["dag_run_id"], "create_request") == request_id
    request = d.setup.state().request(request_id)
    assert request["status"] == "done", request
    assert d.setup.state().progress(request_id, d.chunked)["chunks"] == 3

    d.setup.execute("UPDATE chunked SET v = v + 1 WHERE id = 1")
    apply_now(d)
    diff = d.compare(d.chunked)
    assert diff.equal, diff.describe()


def test_a_quarantined_table_shows_in_the_apply_task_and_a_repair_from_the_form_releases_it(deployment):
    """A statement that changed ``chunked``'s rows without row events (MariaDB's CREATE OR
    REPLACE TABLE, here with the same shape, and the same rows written again, so the other
    tests see the same table): the apply task still succeeds, its result and log name the
    quarantine and the fix, the other table flows; a repair of the table from the form
    (scope "table") releases it, and both targets equal the source."""
    from airflow_provider_dblog.engine.quarantine import quarantined
    d, api = deployment, deployment.api
    d.setup.execute("CREATE OR REPLACE TABLE chunked (id INT PRIMARY KEY, v INT NOT NULL)")
    d.setup.execute("INSERT INTO chunked SELECT seq, 0 FROM seq_1_to_50")
    d.setup.execute("INSERT INTO items VALUES (9101, 'q', 1)")
    run_id = apply_now(d)
    tables = api.xcom(APPLY, run_id, "apply")["tables"]
    assert tables[d.chunked]["status"] == "quarantined", tables
    assert "CREATE OR REPLACE" in tables[d.chunked]["quarantined"]["why"]
    assert tables[d.items]["status"] in ("applied", "up_to_date", "empty"), tables
    log = api.task_log(APPLY, run_id, "apply")
    assert f"{d.chunked} -> tgt: quarantined" in log and f"dump --table {d.chunked}" in log
    assert list(quarantined(d.setup.state())) == [d.chunked]

    run_id, state, tasks = api.run_dag(REPAIR, {"scope": "table", "table": d.chunked}, timeout=RUN_TIMEOUT)
    assert (state, tasks) == ("success", dict.fromkeys(REPAIR_TASKS, "success")), (state, tasks)
    apply_now(d)
    assert quarantined(d.setup.state()) == {}
    for target in ("tgt", "lake"):  # the repair rebuilt the Delta table too
        diff = d.compare(d.chunked, target)
        assert diff.equal, (target, diff.describe())
