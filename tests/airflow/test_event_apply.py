"""The event-driven apply (``apply_schedule: event``) in a RUNNING Airflow: the apply DAG is
scheduled on the Asset ``dblog-ready://tgt``, whose AssetWatcher (``ApplyReadyTrigger``, in
the real triggerer) adds an event when the tail's checkpoint passes the target's. Nobody
triggers a run here: commits in the source reach the target through the tail DAG, the
watcher and the apply DAG alone, including changes made while an apply run is active (one
watcher event per apply run: none while that run has not moved the target).
"""
from __future__ import annotations

import time

import psycopg2

from airflow_provider_dblog.devenv.running_airflow import wait_until
from helpers import POSTGRES_PORT

TAIL = "dblog_tail__src"
APPLY = "dblog_apply__tgt"
WAIT = 240  # a commit's way: tail run start-up, watcher, scheduler, task start, on a loaded 2-core box


def target_conn(d):
    conn = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=d.setup.target_db)
    conn.autocommit = True
    return conn


def target_names(d, table: str) -> dict[int, str]:
    """The target's ``items`` rows (id -> name); empty until the first apply created the table."""
    try:
        conn = target_conn(d)
    except psycopg2.OperationalError as e:
        if "does not exist" in str(e):   # the first apply creates the database too
            return {}
        raise
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (table,))
            if cur.fetchone()[0] is None:
                return {}
            cur.execute(f"SELECT id, name FROM {table}")
            return dict(cur.fetchall())
    finally:
        conn.close()


def lock_waiters(d, table: str) -> int:
    conn = target_conn(d)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass(%s)", (table,))
            return cur.fetchone()[0]
    finally:
        conn.close()


def active_runs(api) -> list[dict]:
    return [r for r in api.runs(APPLY) if r["state"] in ("queued", "running")]


def watcher_events(api) -> list[dict]:
    assets = api.get("/assets", uri_pattern="dblog-ready://tgt")["assets"]
    assert len(assets) == 1, assets
    return api.asset_events(asset_id=assets[0]["id"])


def test_commits_reach_the_target_through_the_watcher_even_one_made_while_an_apply_runs(event_airflow):
    d, api = event_airflow, event_airflow.api
    api.set_paused(TAIL, False)
    api.set_paused(APPLY, False)
    state = d.setup.state()
    wait_until(state.checkpoint, 180, "the tail DAG's first checkpoint", poll=0.5)
    table = d.target_items()

    d.setup.execute("INSERT INTO items VALUES (1, 'first', 1)")
    wait_until(lambda: target_names(d, table).get(1) == "first", WAIT, "row 1 in the target, untriggered",
               poll=0.5)
    runs = api.runs(APPLY)
    assert runs and {r["run_type"] for r in runs} == {"asset_triggered"}, runs
    wait_until(lambda: not active_runs(api), 120, "the apply DAG idle", poll=0.5)

    # hold the next apply run in its merge (after it read the frontier) with a table lock
    lock = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=d.setup.target_db)
    try:
        with lock.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        d.setup.execute("INSERT INTO items VALUES (2, 'second', 2)")

        def blocked_run():
            waiting = lock_waiters(d, table)
            running = [r for r in active_runs(api) if r["state"] == "running"]
            return running[0]["dag_run_id"] if waiting and running else None
        blocked = wait_until(blocked_run, WAIT, "an apply run for row 2 waiting on the lock", poll=0.5)
        events_before = len(watcher_events(api))

        # changes made while that run is active, each its own commit (and tail flush): the
        # watcher adds no event while the run has not moved the target (one event per run)
        for n in (3, 4):
            d.setup.execute(f"INSERT INTO items VALUES ({n}, 'later', {n})")
            d.drain()
        assert not seen_within(lambda: len(watcher_events(api)) > events_before, 5), watcher_events(api)
        assert api.run_state(APPLY, blocked) == "running"
    finally:
        lock.rollback()
        lock.close()

    wait_until(lambda: {3, 4} <= set(target_names(d, table)), WAIT, "rows 3 and 4 in the target", poll=0.5)
    assert api.wait_run(APPLY, blocked) == "success"
    # the held run applied row 2 only (its frontier was read before row 3): the run the watcher
    # started once the held run had moved the target applied rows 3 and 4
    held = api.xcom(APPLY, blocked, "apply")["tables"][d.items]
    assert held["inserted"] == 1, held
    after = [r for r in api.runs(APPLY) if r["run_type"] == "asset_triggered"
             and r["dag_run_id"] != blocked and r["start_date"] and r["start_date"] > held_end(api, blocked)]
    assert after, api.runs(APPLY)
    diff = d.compare(d.items)
    assert diff.equal, diff.describe()


def seen_within(condition, seconds: float) -> bool:
    """Whether ``condition()`` comes true within ``seconds`` (looked at every 0.25 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    return False


def held_end(api, run_id: str) -> str:
    return api.get(f"/dags/{APPLY}/dagRuns/{run_id}")["end_date"]
