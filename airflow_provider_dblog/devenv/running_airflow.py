"""A real, running Airflow for the tests and the bench: api-server, scheduler, dag-processor and triggerer as
separate processes, in a private AIRFLOW_HOME with SQLite metadata (Airflow 3 also needs an
async driver for its metadata database: the venv has aiosqlite, not asyncpg).

Nothing here touches the test process's ``os.environ``: the processes get an environment of
their own, built from scratch for Airflow (the tests' own AIRFLOW_HOME and unit-test mode
are dropped), so the dag.test() tests next to these keep theirs.

Auth is the simple auth manager with one configured admin whose password the home's
password file holds: :class:`AirflowAPI` logs in with ``POST /auth/token`` and sends the JWT
as a bearer token, as a user's script would.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from . import sqlite_metadata

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USER, ROLE = "dblog", "admin"


def wait_until(predicate, timeout: float, what: str, poll: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError saying
    ``what`` did not happen within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(poll)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def airflow_env(home: Path, dags: Path, port: int, metadata_url: str, password_file: Path) -> dict[str, str]:
    """The processes' environment: the test process's, minus every Airflow setting, plus a
    fresh set tuned for a quick test loop (short parse and heartbeat intervals, few slots)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    return base | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        **sqlite_metadata.settings(),
        # the api-server serves the UI, the REST API and the tasks' execution API
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # every component signs or checks the same JWTs (a generated secret would differ per process)
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:{ROLE}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
        # fast: new DAG files seen within seconds, short scheduler and triggerer loops
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
        # the log servers bind fixed ports by default: another Airflow on the machine must not clash
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TZ": "UTC",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


class RunningAirflow:
    """``start()`` migrates the metadata database, starts the four components (each in its
    own process group, output to ``<home>/<component>.log``) and waits until the health
    endpoint reports them all healthy; ``stop()`` ends them and their task processes."""

    def __init__(self, home: Path, dags: Path, extra_env: dict[str, str] | None = None):
        self.home, self.dags = home, dags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(12)
        password_file = home / "passwords.json"
        password_file.write_text(json.dumps({USER: self.password}))
        self.env = airflow_env(home, dags, self.port, sqlite_metadata.url(home / "airflow.db"),
                               password_file) | (extra_env or {})
        self.procs: dict[str, subprocess.Popen] = {}
        self.api = AirflowAPI(self.url, USER, self.password, self.logs)

    def airflow(self, *args: str) -> list[str]:
        return [str(Path(sys.executable).parent / "airflow"), *args]

    def start(self, timeout: float = 240) -> "RunningAirflow":
        migrate = subprocess.run(self.airflow("db", "migrate"), env=self.env, capture_output=True,
                                 text=True, timeout=600)
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        sqlite_metadata.use_wal(self.home / "airflow.db")
        for name in COMPONENTS:
            args = ("api-server", "--port", str(self.port), "--workers", "1") if name == "api-server" else (name,)
            log = open(self.home / f"{name}.log", "w")
            self.procs[name] = subprocess.Popen(self.airflow(*args), env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        wait_until(self._healthy, timeout, "Airflow's components report healthy", poll=0.5)
        return self

    def logs(self, tail: int = 3000) -> str:
        """The end of each component's output (for assertion messages)."""
        return "\n".join(f"--- {name} ---\n{(self.home / f'{name}.log').read_text(errors='replace')[-tail:]}"
                         for name in COMPONENTS if (self.home / f"{name}.log").exists())

    def _healthy(self) -> bool:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"Airflow components exited: {dead}\n{self.logs()}"
        try:
            health = self.api.health()
        except OSError:
            return False
        return all((health.get(part) or {}).get("status") == "healthy"
                   for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    def stop(self, grace: float = 10) -> None:
        """End the components one by one, the api-server last (the scheduler's task processes
        report their end through it): SIGTERM to the component's process group and to every
        process it started (LocalExecutor workers, task supervisors, spark-submit), SIGKILL to
        what is left after ``grace`` seconds."""
        for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _stop_tree(proc, grace)
        self.api.close()


def _stop_tree(proc: subprocess.Popen, grace: float) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    _signal_group(proc.pid, signal.SIGTERM)
    for p in tree:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    _signal_group(proc.pid, signal.SIGKILL)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)
    proc.wait(timeout=10)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


TERMINAL_RUN_STATES = ("success", "failed")


class AirflowAPI:
    """The REST API v2 as a user's script calls it: log in, then bearer-token requests."""

    def __init__(self, url: str, user: str, password: str, server_logs=None):
        import httpx
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=120)   # a server starved of CPU for a while still answers
        self._credentials = {"username": user, "password": password}
        self._token: str | None = None
        self.server_logs = server_logs or (lambda: "")

    # -- plumbing ----------------------------------------------------------------------
    def health(self) -> dict:
        import httpx
        try:
            r = self.http.get("/api/v2/monitor/health")
        except httpx.TransportError as e:
            raise OSError(str(e)) from e
        return r.json() if r.status_code == 200 else {}

    def _login(self) -> str:
        r = self.http.post("/auth/token", json=self._credentials)
        assert r.status_code == 201, (r.status_code, r.text)
        return r.json()["access_token"]

    def request(self, method: str, path: str, **kw):
        """One API call; the response (any status: the caller decides what it expects)."""
        if self._token is None:
            self._token = self._login()
        r = self.http.request(method, "/api/v2" + path, headers={"Authorization": f"Bearer {self._token}"}, **kw)
        if r.status_code == 401:  # expired: log in again once
            self._token = self._login()
            r = self.http.request(method, "/api/v2" + path, headers={"Authorization": f"Bearer {self._token}"},
                                  **kw)
        return r

    def request_retrying_db_error(self, method: str, path: str, timeout: float = 180, **kw):
        """One API call, asked again while it answers 500 "Database error".

        SQLite under WAL refuses, at once and without the 60 s wait, a transaction that read
        before another process committed and then writes (SQLITE_BUSY_SNAPSHOT): the PATCH of a
        DAG the dag-processor had just re-written failed so (CI of stop 45), and so did a POST
        while the whole VM stalled for 62 s (every component's heartbeat late: stop 46). Airflow
        rolled the transaction back, so asking again is safe; the last response is returned."""
        last = []

        def answered():
            r = self.request(method, path, **kw)
            last[:] = [r]
            return r if not (r.status_code == 500 and "Database error" in r.text) else None
        try:
            return wait_until(answered, timeout, f"{method} {path} past a database error", poll=0.5)
        except AssertionError:
            return last[0]

    def _why(self, response) -> str:
        """For an assertion message: a server error hides its cause; the components' logs say it."""
        return self.server_logs() if response.status_code >= 500 else ""

    def get(self, path: str, **params) -> dict:
        r = self.request("GET", path, params=params)
        assert r.status_code == 200, (path, r.status_code, r.text, self._why(r))
        return r.json()

    # -- DAGs and runs ---------------------------------------------------------------
    def wait_parsed(self, dag_id: str, timeout: float = 120) -> dict:
        def parsed():
            r = self.request("GET", f"/dags/{dag_id}")
            return r.json() if r.status_code == 200 else None
        try:
            return wait_until(parsed, timeout, f"DAG {dag_id} parsed", poll=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; import errors: {self.get('/importErrors')}\n{self.server_logs()}") from None

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.wait_parsed(dag_id)
        r = self.request_retrying_db_error("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})
        assert r.status_code == 200, (r.status_code, r.text, self._why(r))

    def trigger_response(self, dag_id: str, conf: dict | None = None):
        """POST a new run (the Trigger form's submit); the raw response."""
        return self.request_retrying_db_error("POST", f"/dags/{dag_id}/dagRuns",
                                              json={"logical_date": None, "conf": conf or {}})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Unpause the DAG (a paused DAG's runs stay queued) and trigger a run; its run id."""
        self.set_paused(dag_id, False)
        r = self.trigger_response(dag_id, conf)
        assert r.status_code == 200, (r.status_code, r.text, self._why(r))
        return r.json()["dag_run_id"]

    def runs(self, dag_id: str, **params) -> list[dict]:
        return self.get(f"/dags/{dag_id}/dagRuns", limit=100, **params)["dag_runs"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        """The run's end state (success or failed), waited for up to ``timeout`` seconds."""
        def ended():
            state = self.run_state(dag_id, run_id)
            return state if state in TERMINAL_RUN_STATES else None
        try:
            return wait_until(ended, timeout, f"run {dag_id}/{run_id} ended", poll=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; tasks: {self.task_states(dag_id, run_id)}") from None

    def run_dag(self, dag_id: str, conf: dict | None = None, timeout: float = 300) -> tuple[str, str, dict]:
        """Trigger, wait for the end: (run id, run state, {task id: state})."""
        run_id = self.trigger(dag_id, conf)
        state = self.wait_run(dag_id, run_id, timeout)
        return run_id, state, self.task_states(dag_id, run_id)

    # -- task instances ------------------------------------------------------------------
    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        entry = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
                         deserialize=True)
        return entry["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log (what the UI shows), as text."""
        out = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                       full_content=True)
        content = out.get("content")
        return content if isinstance(content, str) else "\n".join(
            line if isinstance(line, str) else json.dumps(line) for line in content or [])

    # -- assets --------------------------------------------------------------------------
    def asset_events(self, **filters) -> list[dict]:
        """Asset events, oldest first (filters: source_dag_id, source_run_id, asset_id, ...).

        Airflow 3.3.2 answers 500 while a run an event created is still queued (its null
        ``start_date`` fails the response model of ``created_dagruns``): asked again until the
        run has started."""
        params = {"limit": 100, "order_by": "timestamp", **filters}

        def answered():
            r = self.request("GET", "/assets/events", params=params)
            assert r.status_code in (200, 500), (r.status_code, r.text)
            return (r.json()["asset_events"],) if r.status_code == 200 else None
        return wait_until(answered, 60, f"GET /assets/events?{params} answered", poll=0.5)[0]

    def close(self) -> None:
        self.http.close()


def wait_ti_state(api: AirflowAPI, dag_id: str, run_id: str, task_id: str, wanted: str,
                  timeout: float = 120, refuse: tuple[str, ...] = ("failed", "upstream_failed")) -> dict:
    """Poll one task instance until it is in state ``wanted``: the TI (fails early on ``refuse``)."""
    def reached():
        ti = api.task_instance(dag_id, run_id, task_id)
        assert ti["state"] not in refuse, f"{task_id} is {ti['state']}, waiting for {wanted}"
        return ti if ti["state"] == wanted else None
    return wait_until(reached, timeout, f"{dag_id}.{task_id} in state {wanted}", poll=0.2)
