"""The README's "Repair or backfill from the UI" steps in a real browser (issue 14): headless
Chromium (tests/airflow/browser.py) on a running Airflow's UI (the ``running_airflow`` fixture),
a user who logs in, opens a DAG's Trigger form, fills it with the mouse and keyboard and
presses Trigger. The runs it creates are checked through the REST API and the target database.
The Airflow and its dblog set-up are shared with test_running_*.py: the rows written here are
ids 201-270 of ``items``, and each test looks only at the runs it created.

Screenshots of each step: ``.artifacts/browser/`` (or ``$DBLOG_TEST_ARTIFACTS``); a failed test
also leaves its page's screenshot and HTML there.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.devenv.running_airflow import USER
from browser import TIMEOUT_MS, UI, VIEWPORT, launch
from helpers import wait_until

REPAIR = "dblog_repair__src"
APPLY = "dblog_apply__tgt"
CONTROL = "dblog_dump_control__src"
APPLY_LAKE = "dblog_apply__lake"
MAINTAIN = "dblog_maintain__lake"
VERIFY = "dblog_verify__src"
REPAIR_TASKS = ("create_request", "dump", "apply__tgt", "apply__lake")  # a repair applies every target
RUN_TIMEOUT = 600  # a repair runs Spark (local[2]) on a loaded 2-core machine


@pytest.fixture(scope="module")
def chromium():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: run `make bootstrap` (it installs the test extras)", pytrace=False)
    with sync_playwright() as p:
        browser = launch(p)
        yield browser
        browser.close()


@pytest.fixture
def ui(chromium, running_airflow, request):
    """A fresh browser session (no cookies) on the running Airflow, logged in as user ``dblog``."""
    from playwright.sync_api import expect
    expect.set_options(timeout=TIMEOUT_MS)
    airflow = running_airflow.airflow
    context = chromium.new_context(viewport=VIEWPORT)
    ui = UI(context.new_page(), airflow.url, request.node.name)
    failed_before = request.session.testsfailed
    try:
        ui.login(USER, airflow.password)
    except Exception:
        ui.save_failure()
        raise
    yield ui
    # the call's report is logged before teardown: a failure has been counted by now
    if request.session.testsfailed > failed_before:
        ui.save_failure()
    context.close()


def new_ui_run(api, dag_id: str, before: set[str]) -> dict:
    """The run the form just created (the only new one), as the REST API shows it."""
    def created():
        runs = [r for r in api.runs(dag_id) if r["dag_run_id"] not in before]
        assert len(runs) <= 1, runs
        return runs[0] if runs else None
    return wait_until(created, 60, f"a new run of {dag_id}", poll=0.5)


def run_ids(api, dag_id: str) -> set[str]:
    api.wait_parsed(dag_id)
    return {r["dag_run_id"] for r in api.runs(dag_id)}


def see_run_state(ui: UI, dag_id: str, run_id: str, state: str, task: str = "create_request") -> None:
    """The run's page shows the state (its badge), after the REST API reported it."""
    from playwright.sync_api import expect
    ui.page.goto(f"{ui.url}/dags/{dag_id}/runs/{run_id}")
    ui.page.get_by_role("cell", name=task, exact=True).wait_for()  # (not the operator's cell)
    expect(ui.page.get_by_text(state, exact=True).first).to_be_visible()


def test_a_user_logs_in_on_the_login_page_and_sees_dblogs_dags(ui):
    from playwright.sync_api import expect
    ui.page.goto(ui.url + "/dags")
    for dag_id in (REPAIR, CONTROL, APPLY, "dblog_tail__src"):
        expect(ui.page.get_by_role("link", name=dag_id, exact=True)).to_be_visible()
    ui.shot("dags")


def test_a_keys_repair_from_the_form_fixes_the_target(deployment, ui):
    d, api = deployment, deployment.api
    d.setup.execute("INSERT INTO items SELECT seq, CONCAT('item', seq), seq / 4.0 FROM seq_201_to_260")
    d.drain()
    _, state, _ = api.run_dag(APPLY)
    assert state == "success"
    assert d.compare(d.items).equal

    d.damage_items(207, 208)
    assert not d.compare(d.items).equal

    # the README's steps: DAGs -> dblog_repair__src -> Trigger; scope, table, keys; Trigger
    before = run_ids(api, REPAIR)
    form = ui.open_trigger_form(REPAIR)
    ui.choose(form, "What to dump", "A list of primary keys")
    ui.choose(form, "Table", d.items)
    ui.field(form, "keys").fill("207\n208")
    ui.shot("filled-form")
    ui.trigger_button(form).click()

    run = new_ui_run(api, REPAIR, before)
    assert run["triggered_by"] == "ui" and run["triggering_user_name"] == USER, run
    sizes = {"chunk_size": d.setup.config.dump.chunk_size, "parallelism": d.setup.config.dump.parallelism}
    assert run["conf"] == {"scope": "keys", "table": d.items, "keys": "207\n208", "where": None} | sizes, run["conf"]
    assert api.wait_run(REPAIR, run["dag_run_id"], RUN_TIMEOUT) == "success"
    assert api.task_states(REPAIR, run["dag_run_id"]) == dict.fromkeys(REPAIR_TASKS, "success")
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()
    see_run_state(ui, REPAIR, run["dag_run_id"], "Success")
    ui.shot("run-succeeded")


def test_the_form_triggers_with_its_defaults_a_dump_of_the_first_table(deployment, ui):
    d, api = deployment, deployment.api
    before = run_ids(api, REPAIR)
    form = ui.open_trigger_form(REPAIR)
    ui.shot("default-form")
    ui.trigger_button(form).click()  # no edits

    run = new_ui_run(api, REPAIR, before)
    sizes = {"chunk_size": d.setup.config.dump.chunk_size, "parallelism": d.setup.config.dump.parallelism}
    assert run["conf"] == {"scope": "table", "table": d.items, "keys": None, "where": None} | sizes, run["conf"]
    assert api.wait_run(REPAIR, run["dag_run_id"], RUN_TIMEOUT) == "success"
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()
    see_run_state(ui, REPAIR, run["dag_run_id"], "Success")
    ui.shot("run-succeeded")


def test_keys_that_are_not_integers_fail_the_run_at_create_request(running_airflow, ui):
    api = running_airflow.api
    before = run_ids(api, REPAIR)
    form = ui.open_trigger_form(REPAIR)
    ui.choose(form, "What to dump", "A list of primary keys")
    ui.field(form, "keys").fill("abc")
    ui.trigger_button(form).click()

    run_id = new_ui_run(api, REPAIR, before)["dag_run_id"]
    assert api.wait_run(REPAIR, run_id) == "failed"
    assert api.task_states(REPAIR, run_id) == {"create_request": "failed"} | dict.fromkeys(
        REPAIR_TASKS[1:], "upstream_failed")
    assert "not an integer" in api.task_log(REPAIR, run_id, "create_request")
    see_run_state(ui, REPAIR, run_id, "Failed")
    ui.shot("run-failed")


def test_the_control_form_cannot_be_submitted_without_a_request_id(running_airflow, ui):
    """The request id is a required string with no default: the UI disables Trigger until it is
    typed (the REST API refuses such a run with 400, test_running_airflow.py)."""
    from playwright.sync_api import expect
    api = running_airflow.api
    before = run_ids(api, CONTROL)
    form = ui.open_trigger_form(CONTROL)
    expect(form.get_by_text("This field is required")).to_be_visible()
    expect(ui.trigger_button(form)).to_be_disabled()
    ui.shot("refused-form")

    ui.field(form, "request_id").fill("some-request")
    expect(ui.trigger_button(form)).to_be_enabled()
    expect(form.get_by_text("This field is required")).to_be_hidden()
    assert run_ids(api, CONTROL) == before


def test_the_maintenance_form_of_the_lake_target_runs_a_dry_run_of_one_table(deployment, ui):
    """``dblog_maintain__lake``'s form: a table typed, Dry run switched on, Trigger; the run
    counts the Delta table's files and changes nothing."""
    from airflow_provider_dblog.engine.targets import target_table_name
    d, api = deployment, deployment.api
    d.setup.execute("INSERT INTO items VALUES (261, 'lake', 1)")  # the Delta table exists, with a commit
    d.drain()
    assert api.run_dag(APPLY_LAKE)[1:] == ("success", {"apply": "success"})

    before = run_ids(api, MAINTAIN)
    form = ui.open_trigger_form(MAINTAIN)
    ui.field(form, "tables").fill(d.items)
    ui.switch(form, "dry_run").click()
    ui.shot("filled-form")
    ui.trigger_button(form).click()

    run = new_ui_run(api, MAINTAIN, before)
    assert run["triggered_by"] == "ui" and run["triggering_user_name"] == USER, run
    assert run["conf"] == {"tables": d.items, "retention_hours": 168, "dry_run": True, "z_order": False}, run["conf"]
    assert api.wait_run(MAINTAIN, run["dag_run_id"], RUN_TIMEOUT) == "success"
    result = api.xcom(MAINTAIN, run["dag_run_id"], "maintain")
    report = result["tables"][target_table_name(d.items)]
    assert result["status"] == "dry run" and list(result["tables"]) == [target_table_name(d.items)], result
    assert report["dry_run"] and report["files_after"] == report["files_before"] >= 1, report
    assert report["version_after"] == report["version_before"], report  # no commit
    see_run_state(ui, MAINTAIN, run["dag_run_id"], "Success", task="maintain")
    ui.shot("run-succeeded")


def test_the_verification_form_with_repair_switched_on_finds_and_repairs_damaged_keys(deployment, ui):
    """``dblog_verify__src``'s form: scope "A list of primary keys", the table, two keys typed,
    Repair switched on, Trigger; the run verifies both targets (the apply DAGs run meanwhile:
    the verification waits for them to pass its HW), repairs the damaged key and succeeds."""
    import time
    d, api = deployment, deployment.api
    d.setup.execute("INSERT INTO items VALUES (262, 'verify', 2), (263, 'verify', 3)")
    d.drain()
    assert api.run_dag(APPLY)[1] == "success"
    d.damage_items(262, 263)

    before = run_ids(api, VERIFY)
    form = ui.open_trigger_form(VERIFY)
    ui.choose(form, "What to verify", "A list of primary keys")
    ui.choose(form, "Table", d.items)
    ui.field(form, "keys").fill("262\n263")
    ui.switch(form, "repair").click()
    ui.shot("filled-form")
    ui.trigger_button(form).click()

    run = new_ui_run(api, VERIFY, before)
    assert run["triggered_by"] == "ui" and run["triggering_user_name"] == USER, run
    assert run["conf"] == {"scope": "keys", "table": d.items, "keys": "262\n263", "where": None, "repair": True}, \
        run["conf"]
    deadline = time.monotonic() + RUN_TIMEOUT
    while api.run_state(VERIFY, run["dag_run_id"]) not in ("success", "failed"):
        assert time.monotonic() < deadline, api.task_states(VERIFY, run["dag_run_id"])
        for dag_id in (APPLY, APPLY_LAKE):
            assert api.run_dag(dag_id, timeout=RUN_TIMEOUT)[1] == "success", dag_id
    assert api.run_state(VERIFY, run["dag_run_id"]) == "success", api.task_states(VERIFY, run["dag_run_id"])
    result = api.xcom(VERIFY, run["dag_run_id"], "verify__tgt")
    assert result["repaired"] and result["repair"][d.items]["keys"] == 2, result
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()
    see_run_state(ui, VERIFY, run["dag_run_id"], "Success", task="verify__tgt")
    ui.shot("run-succeeded")
