"""The verification DAG in a RUNNING Airflow (issue 29): ``dblog_verify__src`` of the deployment
the running-Airflow modules share (tests/airflow/conftest.py, ``running_airflow``: targets
``tgt``, PostgreSQL, and ``lake``, Delta), triggered through the REST API v2 with a conf its
form allows. For a damaged ``tgt`` its verify task logs the report and its ``equal__tgt`` task
fails the run; both verify tasks add an event to their ``dblog-verify://<target>`` Asset with
the counts per table; the same conf with ``repair`` makes ``tgt`` equal and the run succeed. The apply DAGs
are triggered while the verification waits for its targets to pass the chunks' HW (the
deployment applies only when triggered).

Rows: ids 5201-5210 of ``items`` (test_running_airflow.py lists the other modules' ids).
"""
from __future__ import annotations

import time

VERIFY = "dblog_verify__src"
APPLIES = ("dblog_apply__tgt", "dblog_apply__lake")
RUN_TIMEOUT = 600  # a loaded 2-core machine


def _verify(d, conf: dict) -> tuple[str, str, dict]:
    """Trigger the verification; apply both targets until it ends: (run id, state, task states)."""
    api = d.api
    run_id = api.trigger(VERIFY, conf)
    deadline = time.monotonic() + RUN_TIMEOUT
    while api.run_state(VERIFY, run_id) not in ("success", "failed"):
        assert time.monotonic() < deadline, api.task_states(VERIFY, run_id)
        for dag_id in APPLIES:
            _, state, _ = api.run_dag(dag_id, timeout=RUN_TIMEOUT)
            assert state == "success", dag_id
    return run_id, api.run_state(VERIFY, run_id), api.task_states(VERIFY, run_id)


def test_a_verification_from_the_form_fails_on_damage_and_repairs_it(deployment):
    d, api = deployment, deployment.api
    d.setup.execute("INSERT INTO items VALUES " + ", ".join(f"({i}, 'v{i}', {i}.25)" for i in range(5201, 5211)))
    d.drain()
    for dag_id in APPLIES:
        assert api.run_dag(dag_id, timeout=RUN_TIMEOUT)[1] == "success"
    d.damage_items(corrupt_id=5202, delete_id=5203)
    conf = {"scope": "keys", "table": d.items, "keys": "5201\n5202\n5203\n5204", "where": None, "repair": False}

    run_id, state, tasks = _verify(d, conf)
    assert (state, tasks) == ("failed", {"verify__tgt": "success", "equal__tgt": "failed", "verify__lake": "success",
                                         "equal__lake": "success"}), (state, tasks)
    log = api.task_log(VERIFY, run_id, "verify__tgt")
    assert "1 missing [[5203]]" in log and "[{'key': [5202], 'columns': ['name']}]" in log, log
    log = api.task_log(VERIFY, run_id, "equal__tgt")
    assert "DBLogVerificationFailed" in log and f"target tgt differs from its source in {d.items}" in log, log
    events = {e["uri"].rstrip("/"): e["extra"] for e in api.asset_events(source_dag_id=VERIFY, source_run_id=run_id)}
    assert set(events) == {"dblog-verify://tgt", "dblog-verify://lake"}, events
    tgt, lake = events["dblog-verify://tgt"]["tables"][d.items], events["dblog-verify://lake"]["tables"][d.items]
    assert (tgt["missing"], tgt["different"], tgt["compared"], tgt["equal"]) == (1, 1, 3, False), tgt
    assert (lake["compared"], lake["equal"]) == (4, True), lake

    run_id, state, tasks = _verify(d, conf | {"repair": True})
    assert (state, set(tasks.values())) == ("success", {"success"}), (state, tasks)
    assert "now equal" in api.task_log(VERIFY, run_id, "verify__tgt")
    events = {e["uri"].rstrip("/"): e["extra"] for e in api.asset_events(source_dag_id=VERIFY, source_run_id=run_id)}
    assert events["dblog-verify://tgt"]["tables"][d.items]["repaired"] is True, events
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()
