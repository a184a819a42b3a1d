"""The provider's operators and the lag sensor, on the real engine and the private servers.

Everything here runs ``operator.execute(context)`` / ``sensor.poke(context)`` in the test
process, except ``test_dump_and_apply_through_spark_submit_in_dag_test``: the one test
that runs real ``spark-submit`` jobs through the Spark provider inside ``dag.test()``.
"""
from __future__ import annotations

import copy
import json
import runpy
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_dblog.assets import apply_alias, table_asset
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.exceptions import DBLogInvalidRequest
from airflow_provider_dblog.operators.apply import DBLogApplyOperator
from airflow_provider_dblog.operators.dump import (
    DBLogCreateDumpOperator,
    DBLogDumpControlOperator,
    DBLogDumpOperator,
)
from airflow_provider_dblog.exceptions import DBLogSparkConnectionError
from airflow_provider_dblog.operators.spark import HANDLED_CONF, DBLogSparkSubmitOperator
from airflow_provider_dblog.operators.tail import DBLogTailOperator
from airflow_provider_dblog.sensors.lag import DBLogLagSensor

ITEMS = {"items": "id INT PRIMARY KEY, v VARCHAR(20)"}
OPERATORS = {
    DBLogCreateDumpOperator: dict(scope="table", table="a.b"),
    DBLogDumpOperator: dict(request_id="r"),
    DBLogDumpControlOperator: dict(request_id="r", action="pause"),
    DBLogTailOperator: dict(),
    DBLogApplyOperator: dict(),
    DBLogSparkSubmitOperator: dict(job="apply_job"),
    DBLogLagSensor: dict(position="00000001-0000000000000004-00000000"),
}



def alias_events(context, target: str = "tgt") -> dict:
    """{asset uri: extra} of the asset events an apply added through its AssetAlias outlet."""
    return {e.dest_asset_key.uri: e.extra for e in context["outlet_events"][apply_alias(target)].asset_alias_events}

def binlog_since(head: dict, *names: str) -> list[str]:
    """Binlog events after ``head`` that name one of ``names`` (other tests share the server)."""
    from helpers import mysql_connect
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"SHOW BINLOG EVENTS IN '{head['file']}' FROM {int(head['pos'])}")
        rows = cur.fetchall()
    return [r[-1] for r in rows if any(n in str(r[-1]) for n in names)]


def redis_keys(setup) -> list[str]:
    state = setup.state()
    return sorted(state.r.scan_iter(match=f"{state.p}:*"))


# -- conventions -----------------------------------------------------------------
@pytest.mark.parametrize("cls", list(OPERATORS), ids=lambda c: c.__name__)
def test_operator_conventions(cls):
    op = cls(task_id="t", **OPERATORS[cls])
    assert "config_path" in cls.template_fields
    assert all(hasattr(op, f) for f in cls.template_fields)
    assert cls.ui_color and cls.ui_color.startswith("#")
    assert ":param" in cls.__doc__ and "Example::" in cls.__doc__
    copy.deepcopy(op)  # Airflow copies tasks (partial_subset, mapped tasks)


def test_templated_fields_include_the_request_inputs():
    assert {"request_id", "max_chunks", "source"} <= set(DBLogDumpOperator.template_fields)
    assert {"scope", "table", "keys", "chunk_size", "parallelism"} <= set(DBLogCreateDumpOperator.template_fields)
    assert {"request_id", "action"} <= set(DBLogDumpControlOperator.template_fields)
    assert {"target", "tables"} <= set(DBLogApplyOperator.template_fields)
    assert {"max_seconds", "max_events"} <= set(DBLogTailOperator.template_fields)
    assert {"target", "table", "position", "max_lag_seconds"} <= set(DBLogLagSensor.template_fields)


def test_invalid_request_fails_without_retry():
    assert issubclass(DBLogInvalidRequest, AirflowFailException)
    assert issubclass(DBLogSparkConnectionError, AirflowFailException)


# -- create dump -----------------------------------------------------------------
def test_create_dump_returns_a_validated_request(dblog_setup, context):
    s = dblog_setup({**ITEMS, "pairs": "a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b)"})
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), scope="keys",
                                  table=f"{s.db}.pairs", keys='[[1, "x"], [2, "y"], [1, "x"]]',
                                  chunk_size="500").execute(context)
    req = s.state().request(rid)
    assert req["status"] == "pending"
    assert req["spec"]["keys"] == [[1, "x"], [2, "y"]]  # parsed, repeats dropped
    assert req["spec"]["chunk_size"] == 500
    assert req["spec"]["parallelism"] == 2  # the config's default
    # a list param rendered by a template as Python text
    rid_py = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), scope="keys",
                                     table=f"{s.db}.pairs", keys="[[3, 'z']]").execute(context)
    assert s.state().request(rid_py)["spec"]["keys"] == [[3, "z"]]
    rid_all = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), scope="all",
                                      table="None", keys="").execute(context)
    assert s.state().request(rid_all)["spec"]["tables"] == s.tables


@pytest.mark.parametrize("kwargs, message", [
    (dict(scope="table", table="{db}.nope"), "not configured"),
    (dict(scope="table", table="{db}.nokey"), "primary key"),
    (dict(scope="keys", table="{db}.items", keys=[[1, 2]]), "key"),
    (dict(scope="keys", table="{db}.items", keys=["abc"]), "abc"),
    (dict(scope="keys", table="{db}.items", keys="[1, 2"), "JSON"),
    (dict(scope="keys", table="{db}.items", keys=[]), "at least one"),
    (dict(scope="everything", table="{db}.items"), "scope"),
    (dict(scope="table", table=None), "needs a table"),
    (dict(scope="table", table="{db}.items", chunk_size=0), "chunk_size"),
    (dict(scope="table", table="{db}.items", parallelism="lots"), "parallelism"),
    (dict(scope="table", table="{db}.items", source="other"), "unknown source"),
], ids=["unknown-table", "no-primary-key", "key-arity", "key-type", "bad-json", "no-keys",
        "bad-scope", "no-table", "chunk-size", "parallelism", "unknown-source"])
def test_create_dump_refuses_bad_input_before_writing_anything(dblog_setup, context, kwargs, message):
    s = dblog_setup({**ITEMS, "nokey": "id INT, v INT"})
    kwargs = {k: v.format(db=s.db) if isinstance(v, str) else v for k, v in kwargs.items()}
    source = s.source()
    _, head = source.current_resume()
    source.close()
    with pytest.raises(DBLogInvalidRequest, match=message) as err:
        DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), **kwargs).execute(context)
    assert "Traceback" not in str(err.value)
    assert redis_keys(s) == []                                      # nothing in Redis
    assert binlog_since(head, s.db, s.wm_ns) == []                   # nothing written to the source


def test_create_dump_where_scope_and_the_repair_form(dblog_setup, context):
    s = dblog_setup(ITEMS)
    for i, v in ((1, "a"), (2, "b"), (3, "a")):
        s.execute("INSERT INTO items VALUES (%s, %s)", (i, v))
    table = f"{s.db}.items"
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), scope="where", table=table,
                                  where="v = 'a'").execute(context)
    assert s.state().request(rid)["spec"]["keys"] == [[1], [3]]
    form = {"scope": "keys", "table": table, "keys": "2\n3\n", "where": "", "chunk_size": 100,
            "parallelism": 2}
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), from_params=True).execute(
        {**context, "params": form})
    assert s.state().request(rid)["spec"]["keys"] == [[2], [3]]
    assert s.state().request(rid)["spec"]["chunk_size"] == 100
    keys_before = redis_keys(s)
    for bad, message in (({"where": "v = 'a'"}, "scope is 'keys'"),
                         ({"scope": "where", "keys": "", "where": "v = 'a'; DROP TABLE items"},
                          "unexpected ';'"),
                         ({"keys": "1, 2"}, "expected 1 value")):
        with pytest.raises(DBLogInvalidRequest, match=message):
            DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), from_params=True).execute(
                {**context, "params": form | bad})
    with pytest.raises(DBLogInvalidRequest, match="matches"):
        DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), scope="where", table=table,
                                where="v = 'zzz'").execute(context)
    assert redis_keys(s) == keys_before


def test_create_dump_resumes_a_request(dblog_setup, context):
    s = dblog_setup({**ITEMS, "other": "id INT PRIMARY KEY"})
    table = f"{s.db}.items"
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=table).execute(context)
    state = s.state()
    state.set_flag(rid, "pause")
    resume = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=table,
                                     resume_request=f" {rid} ")
    assert resume.execute(context) == rid and not state.flag(rid, "pause")
    assert len(state.requests()) == 1                                # nothing new created
    with pytest.raises(DBLogInvalidRequest, match="not .*other"):
        DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=f"{s.db}.other",
                                resume_request=rid).execute(context)
    with pytest.raises(DBLogInvalidRequest, match="unknown dump request"):
        DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=table,
                                resume_request="nope").execute(context)
    state.set_flag(rid, "cancel")
    with pytest.raises(DBLogInvalidRequest, match="cancelled"):
        resume.execute(context)
    # an empty param renders "" (or "None"): a new request
    new = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=table,
                                  resume_request="None").execute(context)
    assert new != rid


def test_engine_errors_are_chained(dblog_setup, context):
    s = dblog_setup(ITEMS)
    with pytest.raises(DBLogInvalidRequest) as err:
        DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=f"{s.db}.nope").execute(context)
    assert type(err.value.__cause__).__name__ == "UnknownTableError"


# -- control -----------------------------------------------------------------------
def test_control_operator_sets_and_clears_flags(dblog_setup, context):
    s = dblog_setup(ITEMS)
    state = s.state()
    source = s.source()
    from airflow_provider_dblog.engine.dump import DumpRunner
    rid = DumpRunner(source, state, None, None, s.config.dump).submit(DumpSpec("table", [f"{s.db}.items"]))
    source.close()

    def run(action):
        return DBLogDumpControlOperator(task_id="x", config_path=str(s.path), request_id=rid,
                                        action=action).execute(context)

    assert run("pause")["pause"] is True and state.flag(rid, "pause")
    out = run("resume")
    assert out["pause"] is False and not state.flag(rid, "pause")
    assert run("cancel")["cancel"] is True and state.flag(rid, "cancel")
    with pytest.raises(DBLogInvalidRequest, match="action"):
        DBLogDumpControlOperator(task_id="x", request_id=rid, action="stop")
    with pytest.raises(DBLogInvalidRequest, match="action"):  # a templated action, checked at run time
        DBLogDumpControlOperator(task_id="x", config_path=str(s.path), request_id=rid,
                                 action="{{ params.action }}").execute(context)
    with pytest.raises(DBLogInvalidRequest, match="unknown dump request"):
        DBLogDumpControlOperator(task_id="x", config_path=str(s.path), request_id="nope",
                                 action="pause").execute(context)
    # a cancelled request: nothing to pause, nothing to resume (engine.requests.control_request)
    with pytest.raises(DBLogInvalidRequest, match="is cancelled: there is nothing to pause"):
        run("pause")
    with pytest.raises(DBLogInvalidRequest, match="cannot be resumed"):
        run("resume")
    assert not state.flag(rid, "pause")


# -- the Spark operators, without running Spark ---------------------------------------
def test_missing_spark_connection_is_a_clear_error(dblog_setup, context):
    s = dblog_setup(ITEMS)
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path), conn_id="spark_nowhere")
    with pytest.raises(DBLogSparkConnectionError) as err:
        op.execute(context)
    msg = str(err.value)
    assert "'spark_nowhere' does not exist" in msg and "YARN" in msg
    assert '{"conn_type":"spark","host":"local[2]"}' in msg
    assert "AIRFLOW_CONN_SPARK_NOWHERE" in msg


def test_spark_connection_without_a_master_is_a_clear_error(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_BARE", "local[2]")  # parses to master '://'
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path), conn_id="spark_bare")
    with pytest.raises(DBLogSparkConnectionError, match="resolves to master '://'"):
        op.execute(context)


def test_a_cluster_deploy_mode_is_refused_before_anything_runs(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTERMODE", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "cluster"}}))
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path), conn_id="spark_clustermode")
    with pytest.raises(DBLogSparkConnectionError, match="client mode only"):
        op.execute(context)


def test_spark_settings_come_from_the_config(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    s.path.write_text(s.path.read_text().replace(
        "spark:\n  master: local[2]\n",
        "spark:\n  master: local[2]\n  conf: {spark.executor.memory: 1g, spark.app.name: mine}\n"
        "  driver_memory: 1g\n"))
    monkeypatch.setenv("DBLOG_PG", '{"conn_type":"postgres","host":"127.0.0.1","port":15432,"login":"postgres"}')
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path), target="tgt",
                            tables=f"{s.db}.items", conf={"spark.executor.memory": "2g"})
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    hook = DBLogHook(config_path=str(s.path))
    op.prepare(hook, context)
    assert op.application.endswith("spark_jobs/apply_job.py")
    assert "mariadb-java-client.jar" in op.jars and "postgresql.jar" in op.jars
    assert not HANDLED_CONF & set(op.conf)
    assert op.conf["spark.executor.memory"] == "2g"          # the operator's conf wins
    assert op.conf["spark.sql.session.timeZone"] == "UTC"
    assert op._driver_memory == "1g"
    assert op.env_vars["SPARK_LOCAL_IP"] == "127.0.0.1" and "PYTHONPATH" in op.env_vars
    assert op.application_args == ["--config", str(s.path), "--target", "tgt", "--tables", f"{s.db}.items"]
    # the command line SparkSubmitHook builds: master from the connection, no credentials
    cmd = op._get_hook()._build_spark_submit_command(op.application)
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert "--jars" in cmd and "--driver-memory" in cmd


def test_spark_job_connections_go_by_environment(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    text = s.path.read_text().replace(
        "  tgt:\n", "  tgt:\n    conn_id: dblog_tgt_pg\n").replace("user: postgres\n", "", 1)
    s.path.write_text(text)
    conn = json.dumps({"conn_type": "postgres", "host": "127.0.0.1", "port": 15432,
                       "login": "postgres", "password": "s3cret"})
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_TGT_PG", conn)
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path))
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    op.prepare(DBLogHook(config_path=str(s.path)), context)
    assert "s3cret" not in " ".join(op._get_hook()._build_spark_submit_command(op.application))
    # already in this process's environment: spark-submit inherits it
    assert op.env_vars.get("AIRFLOW_CONN_DBLOG_TGT_PG", conn) == conn


FAKE_SPARK_SUBMIT = """#!{python}
# a stand-in for spark-submit: what a dblog job reports (engine.jobs.JobReport), per $FAKE_SPARK_MODE
import json, os, sys
import redis
args = sys.argv[1:]
mode = os.environ["FAKE_SPARK_MODE"]
report = args[args.index("--result-file") + 1]
def say(**kw):
    with open(report, "w") as f:
        json.dump(kw, f)
print("25/11/22 00:00:00 WARN NativeCodeLoader: whatever", flush=True)
if mode == "cancel":
    rid = args[args.index("--request") + 1]
    r = redis.Redis.from_url(os.environ["FAKE_REDIS_URL"], decode_responses=True)
    r.hset(os.environ["FAKE_REQUEST_KEY_PREFIX"] + rid, "status", "cancelled")
    say(error="DumpCancelledError: dump " + rid + " cancelled")
    sys.exit(1)
if mode == "fail":
    print("Traceback (most recent call last): ...", flush=True)
    say(error="WindowTimeoutError: window w1 of db.t did not close within 60s")
    sys.exit(1)
if mode == "killed":  # died without a word
    sys.exit(137)
if mode == "noresult":
    sys.exit(0)
if mode == "nice":  # report the niceness spark-submit was started with
    say(result={{"nice": os.nice(0)}})
    sys.exit(0)
say(result=json.loads(os.environ["FAKE_RESULT"]))
"""


@pytest.fixture
def fake_spark_submit(tmp_path, monkeypatch):
    import os
    import sys
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    exe = bindir / "spark-submit"
    exe.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def mode(m: str, **env: str) -> None:
        monkeypatch.setenv("FAKE_SPARK_MODE", m)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    return mode


def spark_only(s) -> None:
    """``apply: {local_max_events: 0}``: DBLogApplyOperator always takes the Spark path."""
    import yaml
    raw = yaml.safe_load(s.path.read_text())
    s.path.write_text(yaml.safe_dump(raw | {"apply": {"local_max_events": 0}}))


def test_spark_job_error_line_becomes_the_task_error(dblog_setup, context, fake_spark_submit):
    s = dblog_setup(ITEMS)
    spark_only(s)
    fake_spark_submit("fail")
    from airflow_provider_dblog.engine.jobs import SparkJobError
    with pytest.raises(SparkJobError, match="apply_job failed: WindowTimeoutError: window w1") as err:
        DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(context)
    assert "Cannot execute" in str(err.value.__cause__)   # the Spark provider's own error, chained
    fake_spark_submit("noresult")
    with pytest.raises(SparkJobError, match="exited 0 without reporting a result"):
        DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(context)
    fake_spark_submit("killed")
    with pytest.raises(SparkJobError, match="apply_job failed without reporting why") as err:
        DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(context)
    assert "Cannot execute" in str(err.value.__cause__)


def load_config_from(raw: dict):
    from airflow_provider_dblog.engine.config import parse_config
    return parse_config(raw)


def test_spark_nice_lowers_only_the_spark_submit_process(dblog_setup, context, fake_spark_submit):
    import os

    import yaml
    s = dblog_setup(ITEMS)
    raw = yaml.safe_load(s.path.read_text())
    raw["spark"] = {**(raw.get("spark") or {}), "nice": 7}
    s.path.write_text(yaml.safe_dump(raw))
    fake_spark_submit("nice")
    own = os.nice(0)
    result = DBLogSparkSubmitOperator(task_id="j", job="apply_job", config_path=str(s.path)).execute(context)
    assert result == {"nice": min(19, own + 7)}
    assert os.nice(0) == own  # the task itself keeps its priority
    # the dblog command's path (engine.jobs.run_spark_job) starts its child the same way
    import subprocess
    import sys
    from airflow_provider_dblog.engine.config import load_config
    from airflow_provider_dblog.engine.jobs import spark_preexec
    out = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True,
                         text=True, check=True, preexec_fn=spark_preexec(load_config(str(s.path))))
    assert int(out.stdout) == min(19, own + 7) and os.nice(0) == own
    raw["spark"]["nice"] = 0
    out = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True,
                         text=True, check=True, preexec_fn=spark_preexec(load_config_from(raw)))
    assert int(out.stdout) == own


def test_apply_result_through_the_spark_provider(dblog_setup, context, fake_spark_submit):
    s = dblog_setup(ITEMS)
    spark_only(s)
    (table,) = s.tables
    result = {"target": "tgt", "tables": {table: {"status": "applied", "events": 7, "inserted": 3,
                                                   "updated": 2, "deleted": 1, "to": "0000000c-0000000000000010-00000000"}}}
    fake_spark_submit("ok", FAKE_RESULT=json.dumps(result))
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path))
    # the job's result, plus what engine.apply.choose_via counted (local_max_events 0: nothing)
    assert op.execute(context) | {"choose_s": 0} == result | {
        "pending_events": -1, "local_max_events": 0, "choose_s": 0}
    assert alias_events(context) == {table_asset("src", table).uri: {
        "target": "tgt", "status": "applied", "events": 7, "inserted": 3, "updated": 2,
        "deleted": 1, "orphans_deleted": 0, "position": "0000000c-0000000000000010-00000000"}}


def test_dump_cancelled_during_the_run_is_skipped(dblog_setup, context, fake_spark_submit):
    s = dblog_setup(ITEMS)
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=f"{s.db}.items").execute(context)
    state = s.state()
    fake_spark_submit("cancel", FAKE_REDIS_URL=s.config.redis_url, FAKE_REQUEST_KEY_PREFIX=state.k("request", ""))
    with pytest.raises(AirflowSkipException, match="cancelled during the run"):
        DBLogDumpOperator(task_id="d", config_path=str(s.path), request_id=rid).execute(context)


def test_dump_operator_refuses_unknown_and_skips_cancelled_requests(dblog_setup, context):
    s = dblog_setup(ITEMS)
    with pytest.raises(DBLogInvalidRequest, match="unknown dump request 'nope'"):
        DBLogDumpOperator(task_id="d", config_path=str(s.path), request_id="nope").execute(context)
    with pytest.raises(DBLogInvalidRequest, match="request_id is empty"):
        DBLogDumpOperator(task_id="d", config_path=str(s.path), request_id="None").execute(context)
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=f"{s.db}.items").execute(context)
    s.state().set_flag(rid, "cancel")
    with pytest.raises(AirflowSkipException, match="cancelled"):  # before any spark-submit
        DBLogDumpOperator(task_id="d", config_path=str(s.path), request_id=rid).execute(context)


def test_dump_result_becomes_progress_and_metrics(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    rid = DBLogCreateDumpOperator(task_id="c", config_path=str(s.path), table=f"{s.db}.items").execute(context)
    state = s.state()
    table = f"{s.db}.items"
    state.save_progress(rid, table, {"chunks": 1, "rows": 10, "dropped": 0})
    metrics = []
    from airflow.sdk.observability.stats import Stats
    monkeypatch.setattr(Stats, "incr", lambda name, n=None, **kw: metrics.append((name, n)))
    monkeypatch.setattr(Stats, "gauge", lambda name, v, **kw: metrics.append((name, "gauge")))
    op = DBLogDumpOperator(task_id="d", config_path=str(s.path), request_id=rid)
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    hook = DBLogHook(config_path=str(s.path))
    op.job_arguments(hook, context)  # records the totals before the run
    state.save_progress(rid, table, {"chunks": 3, "rows": 25, "dropped": 2, "done": True})
    state.set_request_status(rid, "paused")
    result = {"request": rid, "status": "paused", "tables": {table: state.progress(rid, table)}}
    # a paused dump is not a finished one: skipped, not Success; its summary is still in XCom
    with pytest.raises(AirflowSkipException, match=f"dump request {rid} is paused after 3 chunk"):
        op.handle_result(result, hook, context)
    assert context["ti"].xcom["return_value"] == result
    progress = context["ti"].xcom["progress"]
    assert progress["status"] == "paused"
    assert (progress["chunks"], progress["rows"], progress["dropped"], progress["windows"]) == (3, 25, 2, 3)
    assert ("dblog.dump.rows", 15) in metrics and ("dblog.dump.chunks", 2) in metrics
    assert ("dblog.dump.dropped", 2) in metrics
    state.set_request_status(rid, "cancelled")
    with pytest.raises(AirflowSkipException):
        op.handle_result(result | {"status": "cancelled"}, hook, context)


def test_small_apply_runs_in_process_with_the_same_result_and_assets(dblog_setup, context, fake_spark_submit):
    """Below apply.local_max_events no spark-submit runs (the fake one would fail the task):
    the rows land, the XCom has the Spark job's shape, the asset event's extra is the same."""
    from helpers import TailThread

    s = dblog_setup(ITEMS)
    (table,) = s.tables
    fake_spark_submit("fail")
    tail = TailThread(s).start()
    try:
        for i in range(30):
            s.execute("INSERT INTO items VALUES (%s, %s)", (i, f"v{i} é"))
        s.execute("UPDATE items SET v = 'new' WHERE id = 3")
        s.execute("DELETE FROM items WHERE id = 4")
        tail.drain()
    finally:
        tail.stop()
    result = DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(context)
    r = result["tables"][table]
    assert result["via"] == "local" and r["via"] == "local" and result["pending_events"] == 32
    assert r["status"] == "applied" and r["events"] == 32 and r["inserted"] == 29 and r["deleted"] == 0
    assert result["changed"] == [table] and result["target"] == "tgt"
    schema = s.source().table_schema(table)
    assert s.target().count(schema) == 29
    assert alias_events(context) == {table_asset("src", table).uri: {
        "target": "tgt", "status": "applied", "events": 32, "inserted": 29, "updated": 0,
        "deleted": 0, "orphans_deleted": 0, "position": r["to"]}}
    # and again: nothing to apply, still no Spark, and no asset event (no consumer wakes up)
    from airflow.sdk.execution_time.context import OutletEventAccessors
    quiet = context | {"outlet_events": OutletEventAccessors()}
    again = DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(quiet)
    assert again["via"] == "local" and again["tables"][table]["status"] == "up_to_date"
    assert alias_events(quiet) == {}


def test_an_apply_with_a_failing_table_adds_the_applied_tables_events_then_fails(dblog_setup, context,
                                                                                  fake_spark_submit):
    """One table's own apply error (a CHECK constraint added in the warehouse) fails the task
    naming it, after the other table's rows landed and its Asset event was added."""
    from psycopg2 import sql

    from airflow_provider_dblog.engine.errors import TablesNotAppliedError
    from airflow_provider_dblog.engine.targets import target_table_name
    from helpers import TailThread

    s = dblog_setup({"items": "id INT PRIMARY KEY, v INT", "other": "id INT PRIMARY KEY, v INT"})
    items, other = s.tables
    fake_spark_submit("fail")
    broken = target_table_name(s.source().table_schema(items))
    tail = TailThread(s).start()
    try:
        s.execute("INSERT INTO items VALUES (1, 1)")
        s.execute("INSERT INTO other VALUES (1, 1)")
        tail.drain()
        DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(context)   # the target tables
        with s.target() as t, t.conn, t.conn.cursor() as cur:
            cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT small CHECK (v < 100)").format(sql.Identifier(broken)))
        s.execute("INSERT INTO items VALUES (2, 500)")
        s.execute("INSERT INTO other VALUES (2, 500)")
        tail.drain()
    finally:
        tail.stop()
    from airflow.sdk.execution_time.context import OutletEventAccessors
    second = context | {"outlet_events": OutletEventAccessors()}
    with pytest.raises(TablesNotAppliedError, match=rf"{items}: CheckViolation"):
        DBLogApplyOperator(task_id="apply", config_path=str(s.path)).execute(second)
    assert list(alias_events(second)) == [table_asset("src", other).uri], alias_events(second)
    assert s.target().count(s.source().table_schema(other)) == 2


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_apply_into_a_lake_table_adds_an_event_to_its_own_asset_with_the_version(dblog_setup, context,
                                                                                   fake_spark_submit, kind):
    """Issue 28: the lake table's Asset (its location / iceberg:// URI) gets an event whose
    extra carries the table version the run made (Delta version / Iceberg snapshot id)
    and the rows inserted, updated and deleted; the source table's Asset gets the same."""
    import yaml
    from helpers import TailThread, lake_target
    from airflow_provider_dblog.engine.targets import open_target

    s = dblog_setup(ITEMS)
    (table,) = s.tables
    raw = yaml.safe_load(s.path.read_text())
    raw["targets"]["lake"] = lake_target(kind, s.path.parent / ("lake" if kind == "delta" else "warehouse"))
    s.path.write_text(yaml.safe_dump(raw))
    fake_spark_submit("fail")
    tail = TailThread(s).start()
    try:
        for i in range(10):
            s.execute("INSERT INTO items VALUES (%s, %s)", (i, f"v{i}"))
        s.execute("UPDATE items SET v = 'new' WHERE id = 3")
        tail.drain()
    finally:
        tail.stop()
    result = DBLogApplyOperator(task_id="apply", config_path=str(s.path), target="lake").execute(context)
    r = result["tables"][table]
    assert r["status"] == "applied" and r["inserted"] == 10, r
    schema = s.source().table_schema(table)
    with open_target(s.config.target("lake")) as target:
        uri, version = target.uri(schema), target.version(schema)
        try:
            assert target.count(schema) == 10
        finally:
            target.drop_all()
    assert uri.startswith("file:///" if kind == "delta" else "iceberg://127.0.0.1:")
    want = {"target": "lake", "status": "applied", "events": 11, "inserted": 10, "updated": 0, "deleted": 0,
            "orphans_deleted": 0, "position": r["to"], "version": version}
    assert alias_events(context, "lake") == {table_asset("src", table).uri: want, uri: want}


# -- apply outlets ------------------------------------------------------------------
def test_apply_outlet_is_the_targets_alias(dblog_setup):
    s = dblog_setup({**ITEMS, "other": "id INT PRIMARY KEY"})
    op = DBLogApplyOperator(task_id="apply", config_path=str(s.path))
    assert op.outlets == [apply_alias("tgt")] and op.outlets[0].name == "dblog.apply.tgt"
    sub = DBLogApplyOperator(task_id="apply", config_path=str(s.path), target="tgt", tables=[f"{s.db}.other"])
    assert sub.outlets == [apply_alias("tgt")]
    mine = [table_asset("src", "x.y")]
    assert DBLogApplyOperator(task_id="apply", config_path=str(s.path), outlets=mine).outlets == mine
    # not known at parse time: no outlets rather than a guess
    assert DBLogApplyOperator(task_id="apply", config_path="{{ var.value.cfg }}").outlets == []


# -- tail ----------------------------------------------------------------------------
def test_tail_skips_when_another_tail_holds_the_lease(dblog_setup, context):
    s = dblog_setup(ITEMS)
    state = s.state()
    token = state.acquire_lease("other-worker:42", 30)
    assert token
    keys = redis_keys(s)
    with pytest.raises(AirflowSkipException, match="other-worker:42"):
        DBLogTailOperator(task_id="tail", config_path=str(s.path), max_seconds=5).execute(context)
    assert redis_keys(s) == keys and state.checkpoint() is None   # nothing touched
    assert state.r.get(state.k("lease")) == token


def test_tail_operator_runs_bounded_and_checkpoints(dblog_setup, context, monkeypatch):
    s = dblog_setup(ITEMS)
    metrics = []
    from airflow.sdk.observability.stats import Stats
    monkeypatch.setattr(Stats, "incr", lambda name, n=None, **kw: metrics.append((name, n, kw.get("tags"))))
    monkeypatch.setattr(Stats, "gauge", lambda name, v, **kw: metrics.append((name, v, kw.get("tags"))))
    first = DBLogTailOperator(task_id="tail", config_path=str(s.path), max_seconds=1).execute(context)
    assert first["events"] == 0 and first["start"]   # starts at the log's end (other tests may write)
    for i in range(5):
        s.execute("INSERT INTO items VALUES (%s, %s)", (i, f"v{i}"))
    out = DBLogTailOperator(task_id="tail", config_path=str(s.path), max_seconds="30",
                            max_events="5").execute(context)
    assert out["events"] == 5 and out["per_table"] == {f"{s.db}.items": 5}
    assert out["start"] == first["end"] and Position.decode(out["end"]) > Position.decode(out["start"])
    assert out["seconds"] < 30 and out["flushes"] >= 1
    assert s.state().checkpoint().pos.encode() == out["end"]
    assert ("dblog.tail.events", 5, {"source": "src"}) in metrics
    assert {m[0] for m in metrics} >= {"dblog.tail.lag_seconds", "dblog.tail.events_per_second"}
    assert s.state().r.get(s.state().k("lease")) is None            # released


def test_tail_operator_stops_cleanly_on_kill(dblog_setup, context):
    s = dblog_setup(ITEMS)
    op = DBLogTailOperator(task_id="tail", config_path=str(s.path), max_seconds=120)
    threading.Timer(2.0, op.on_kill).start()
    t0 = time.monotonic()
    out = op.execute(context)
    assert time.monotonic() - t0 < 30 and out["stopped"] is True
    assert s.state().checkpoint().pos.encode() == out["end"]


def test_tail_operator_must_be_bounded(dblog_setup, context):
    with pytest.raises(DBLogInvalidRequest, match="bounded"):
        DBLogTailOperator(task_id="tail", max_seconds=None).execute(context)


# -- lag sensor ------------------------------------------------------------------------
def test_lag_sensor_needs_exactly_one_condition():
    with pytest.raises(DBLogInvalidRequest):
        DBLogLagSensor(task_id="lag")
    with pytest.raises(DBLogInvalidRequest):
        DBLogLagSensor(task_id="lag", position="x", max_lag_seconds=5)


def test_lag_sensor_waits_for_a_position(dblog_setup, context):
    s = dblog_setup({**ITEMS, "other": "id INT PRIMARY KEY"})
    items, other = s.tables
    want = Position(1, 5000, 0)
    sensor = DBLogLagSensor(task_id="lag", config_path=str(s.path), position=want.encode())
    assert sensor.poke(context).is_done is False               # nothing applied yet
    target = s.target()
    try:
        target.advance_applied("src", items, Position(1, 6000, 0))
        target.advance_applied("src", other, Position(1, 4000, 0))
        assert sensor.poke(context).is_done is False             # other is behind
        only_items = DBLogLagSensor(task_id="lag", config_path=str(s.path), table=items, position=want.encode())
        assert only_items.poke(context).is_done is True
        target.advance_applied("src", other, want)                 # every event below want applied
        done = sensor.poke(context)
        assert done.is_done is True and done.xcom_value["applied"][other] == want.encode()
    finally:
        target.close()
    with pytest.raises(DBLogInvalidRequest, match="not an encoded position"):
        DBLogLagSensor(task_id="lag", config_path=str(s.path), position="123").poke(context)
    with pytest.raises(DBLogInvalidRequest, match="not configured"):
        DBLogLagSensor(task_id="lag", config_path=str(s.path), table="x.y", position=want.encode()).poke(context)


def test_lag_sensor_bounds_the_lag_with_checkpoint_samples(dblog_setup, context):
    s = dblog_setup(ITEMS)
    (items,) = s.tables
    state = s.state()
    ctx = {**context}
    DBLogTailOperator(task_id="tail", config_path=str(s.path), max_seconds=1).execute(ctx)
    first = state.checkpoint()
    s.execute("INSERT INTO items VALUES (1, 'a')")  # the source's head moves past the checkpoint
    DBLogTailOperator(task_id="tail", config_path=str(s.path), max_events=1, max_seconds=30).execute(ctx)
    cp = state.checkpoint()
    s.execute("INSERT INTO items VALUES (2, 'b')")  # not tailed: the head is past the checkpoint
    sensor = DBLogLagSensor(task_id="lag", config_path=str(s.path), max_lag_seconds=3600)
    target = s.target()
    try:
        target.advance_applied("src", items, Position(cp.pos.log, cp.pos.offset - 1, 0))
        # applied is below the last checkpoint: the bound comes from the first tail's sample
        assert state.captured_at(Position(cp.pos.log, cp.pos.offset - 1, 0)) == pytest.approx(first.updated_at)
        assert state.captured_at(cp.pos) == pytest.approx(cp.updated_at)
        assert state.captured_at(Position(0, 0, 0)) is None  # nothing captured that early: unknown
        below = sensor.poke(ctx)
        assert below.xcom_value["lag_s"] >= time.time() - first.updated_at - 1
        target.advance_applied("src", items, cp.pos)
        before = time.time() - cp.updated_at
        at = sensor.poke(ctx)
        after = time.time() - cp.updated_at
        # the lag is the age of the checkpoint the target reached, read during the poke
        assert at.is_done is True and before - 0.01 <= at.xcom_value["lag_s"] <= after + 0.01
        strict = DBLogLagSensor(task_id="lag", config_path=str(s.path), max_lag_seconds=0)
        assert strict.poke(ctx).is_done is False
        head, _ = s.source().current_resume()
        # at or past the source's log head (other tests share the server: well past it)
        target.advance_applied("src", items, Position(head.log, head.offset + 10**12, 0))
        now = strict.poke(ctx)
        assert now.is_done is True and now.xcom_value["lag_s"] == 0.0
    finally:
        target.close()


E2E_DAG = """
from airflow.sdk import DAG

from airflow_provider_dblog.operators.apply import DBLogApplyOperator
from airflow_provider_dblog.operators.dump import DBLogCreateDumpOperator, DBLogDumpOperator
from airflow_provider_dblog.sensors.lag import DBLogLagSensor

with DAG("{dag_id}", schedule=None, catchup=False) as dag:
    create = DBLogCreateDumpOperator(task_id="create_dump", config_path="{path}", scope="table",
                                     table="{table}")
    dump = DBLogDumpOperator(task_id="dump", config_path="{path}", request_id=create.output)
    apply = DBLogApplyOperator(task_id="apply", config_path="{path}")
    caught_up = DBLogLagSensor(task_id="caught_up", config_path="{path}", max_lag_seconds=600,
                               poke_interval=1, timeout=120)
    create >> dump >> apply >> caught_up
"""


# -- the one end-to-end test: real spark-submit through the Spark provider, in dag.test() --------
def test_dump_and_apply_through_spark_submit_in_dag_test(dblog_setup, airflow_db):
    """create dump -> dump (spark-submit) -> apply (in-process: a small batch) -> lag sensor,
    while a tail runs and the table changes; the target ends equal to the source, with asset
    events."""
    from airflow_provider_dblog.engine.config import load_config
    from airflow_provider_dblog.engine.targets import target_table_name
    from airflow_provider_dblog.engine.verify import compare_source_target
    from helpers import TailThread

    s = dblog_setup(ITEMS)
    table = f"{s.db}.items"
    for i in range(20):  # before the tail: only the dump brings these
        s.execute("INSERT INTO items VALUES (%s, %s)", (i, f"old{i}"))
    cfg = load_config(s.path)
    tail = TailThread(s).start()
    s.execute("UPDATE items SET v = 'new' WHERE id = 3")
    s.execute("DELETE FROM items WHERE id = 4")
    s.execute("INSERT INTO items VALUES (100, 'log')")

    # dag.test() runs a DAG of the dags folder (it syncs the folder's bundle to the database)
    dag_id = f"dblog_operators_e2e_{s.db}"
    dag_file = Path(airflow_db) / "dags" / f"{dag_id}.py"
    dag_file.write_text(E2E_DAG.format(dag_id=dag_id, path=str(s.path), table=table))
    module = runpy.run_path(str(dag_file))
    dag, apply = module["dag"], module["apply"]
    assert apply.outlets == [apply_alias("tgt")]
    try:
        dr = dag.test()
    finally:
        tail.stop()  # raises the tail's error, if it had one
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert set(states.values()) == {"success"}, states

    schema = s.source().table_schema(table)
    diff = compare_source_target(cfg.source(), cfg.target(), schema, target_table_name(schema))
    assert diff.equal, diff.describe()
    assert s.target().count(schema) == 20  # 20 - 1 deleted + 1 inserted

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    with create_session() as session:
        events = session.execute(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.uri == table_asset("src", table).uri)).scalars().all()
        extras = [e.extra for e in events]
    assert extras and extras[-1]["target"] == "tgt" and extras[-1]["status"] == "applied"
    assert extras[-1]["inserted"] == 20 and extras[-1]["position"]
