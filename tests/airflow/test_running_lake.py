"""A lake target in a RUNNING Airflow (issue 28): the Delta target ``lake`` beside ``tgt`` in the
deployment the running-Airflow modules share (tests/airflow/conftest.py, ``running_airflow``),
driven through the REST API v2 as a user's script would. Small applies of ``dblog_apply__lake``
each add an event to the lake table's own Asset (its location, ``file://...``); the maintenance
DAG ``dblog_maintain__lake``, triggered with a conf its form allows, compacts the table's files
without changing a row or the applied position; a conf naming a table the lake does not have
fails the run and the task log says why; a retention below what the Delta table keeps is
refused by the form itself.

Rows: ids 5001-5100 of ``items`` (test_running_airflow.py lists the other modules' ids).
"""
from __future__ import annotations

import pytest

APPLY = "dblog_apply__lake"
MAINTAIN = "dblog_maintain__lake"
LAKE = "lake"
SMALL_APPLIES = 4  # one commit each: one more file each, for the compaction to merge
RUN_TIMEOUT = 600  # a loaded 2-core machine


def lake_items(d) -> tuple:
    """The lake's ``items``: its Asset URI, its rows (with their positions), its applied position."""
    source = d.setup.source()
    try:
        schema = source.table_schema(d.items)
    finally:
        source.close()
    with d.setup.target(LAKE) as target:
        return target.uri(schema), target.rows(schema, with_pos=True), target.applied_pos("src", schema)


def apply_lake(d) -> str:
    """Let the tail read everything written so far, then run the lake's apply DAG: its run id."""
    d.drain()
    run_id, state, tasks = d.api.run_dag(APPLY)
    assert (state, tasks) == ("success", {"apply": "success"}), (state, tasks)
    return run_id


def test_small_applies_add_events_to_the_lake_tables_asset_and_the_maintenance_dag_compacts_it(deployment):
    from airflow_provider_dblog.engine.targets import target_table_name
    d, api = deployment, deployment.api
    apply_lake(d)  # what the other modules wrote: the runs below apply one row each
    runs = []
    for i in range(SMALL_APPLIES):
        d.setup.execute("INSERT INTO items VALUES (%s, %s, %s)", (5001 + i, f"lake{i}", i))
        runs.append(apply_lake(d))
    diff = d.compare(d.items, LAKE)
    assert diff.equal, diff.describe()
    uri, rows, applied = lake_items(d)
    assert uri.startswith("file://") and uri.endswith("/" + target_table_name(d.items)), uri

    # each run changed the table: one event on its source table's Asset, one on the lake table's
    db, table = d.items.split(".")
    versions = []
    for run_id in runs:
        events = api.asset_events(source_dag_id=APPLY, source_run_id=run_id)
        assert sorted(e["uri"] for e in events) == sorted([f"dblog://src/{db}/{table}", uri]), events
        extra = next(e["extra"] for e in events if e["uri"] == uri)
        assert (extra["target"], extra["inserted"], extra["updated"], extra["deleted"]) == (LAKE, 1, 0, 0), extra
        versions.append(extra["version"])
    assert versions == sorted(set(versions)), versions  # each a new Delta version
    # the Asset itself (no DAG reads it here: not an "active" one) and its events
    assets = api.get("/assets", uri_pattern=table, only_active=False, limit=100)["assets"]
    (asset,) = [a for a in assets if a["uri"] == uri]
    assert asset["name"] == f"dblog.lake.{db}.{table}", asset
    assert {e["source_run_id"] for e in api.asset_events(asset_id=asset["id"])} >= set(runs)

    # a conf the form allows (its fields, each within its bounds)
    conf = {"tables": d.items, "retention_hours": 168, "dry_run": False, "z_order": False}
    run_id, state, tasks = api.run_dag(MAINTAIN, conf, timeout=RUN_TIMEOUT)
    assert (state, tasks) == ("success", {"maintain": "success"}), (state, tasks)
    result = api.xcom(MAINTAIN, run_id, "maintain")
    name = target_table_name(d.items)
    assert (result["target"], result["kind"], result["status"], list(result["tables"])) == (
        LAKE, "delta", "done", [name]), result
    report = result["tables"][name]
    assert report["files_before"] >= SMALL_APPLIES and report["files_after"] < report["files_before"], report
    assert lake_items(d) == (uri, rows, applied)  # the same rows, applied up to the same position
    log = api.task_log(MAINTAIN, run_id, "maintain")
    assert f"lake.{name}: {report['files_before']} -> {report['files_after']} files" in log, log
    # no row changed: no event wakes the table's readers
    assert api.asset_events(source_dag_id=MAINTAIN, source_run_id=run_id) == []


def test_the_maintenance_form_refuses_a_retention_below_what_delta_keeps(deployment):
    """The form's minimum follows the target's kind (a Delta table keeps 168 hours): the REST
    API refuses the conf, no run is created."""
    api = deployment.api
    runs_before = len(api.runs(MAINTAIN))
    r = api.trigger_response(MAINTAIN, {"tables": deployment.items, "retention_hours": 24})
    assert r.status_code == 400 and "168" in r.text and "retention_hours" in r.text, (r.status_code, r.text)
    assert len(api.runs(MAINTAIN)) == runs_before


@pytest.mark.parametrize("conf, words", [
    (lambda d: {"tables": f"{d.items}, nope.nope"}, "target lake has no table(s) nope__nope; it has: "),
], ids=["unknown-table"])
def test_a_maintenance_run_the_lake_refuses_fails_and_its_log_says_why(deployment, conf, words):
    """The conf passes the form (the REST API takes it), the task refuses it before any work."""
    from airflow_provider_dblog.engine.targets import target_table_name
    d, api = deployment, deployment.api
    d.setup.execute("REPLACE INTO items VALUES (5100, 'refused', 1)")  # the lake has the table
    apply_lake(d)
    _, rows, applied = lake_items(d)
    run_id, state, tasks = api.run_dag(MAINTAIN, conf(d), timeout=RUN_TIMEOUT)
    assert (state, tasks) == ("failed", {"maintain": "failed"}), (state, tasks)
    log = api.task_log(MAINTAIN, run_id, "maintain")
    assert words in log and target_table_name(d.items) in log, log
    assert lake_items(d)[1:] == (rows, applied)
