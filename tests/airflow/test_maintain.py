"""Maintenance of lake targets in Airflow (issue 28): the factory's ``dblog_maintain__<target>``
DAG for each lake target (scheduled and from a form), and DBLogMaintainOperator on real
Delta and Iceberg tables filled by the real apply: many small applies, then fewer files,
the same rows, the applied position unchanged. A PostgreSQL target has nothing to do."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.exceptions import DBLogInvalidRequest
from airflow_provider_dblog.operators.maintain import DBLogMaintainOperator

DAGS = Path(__file__).resolve().parents[2] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))

ITEMS = {"items": "id INT PRIMARY KEY, v VARCHAR(20)"}


def _config(tmp_path, **airflow) -> str:
    cfg = {"sources": {"a": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["d.t1"]}},
           "targets": {"wh": {"kind": "postgres", "source": "a", "host": "h", "port": 2, "user": "u"},
                       "lake": {"kind": "delta", "source": "a", "path": str(tmp_path / "lake")},
                       "ice": {"kind": "iceberg", "source": "a", "path": str(tmp_path / "wh"), "host": "h",
                               "port": 2, "user": "u", "database": "cat"}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": str(tmp_path)},
           **({"airflow": airflow} if airflow else {})}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_each_lake_target_gets_a_maintenance_dag_with_a_form(tmp_path):
    from dblog_factory import build_dags
    dags = build_dags(_config(tmp_path, maintain_schedule="0 3 * * *"))
    assert {d for d in dags if d.startswith("dblog_maintain__")} == {"dblog_maintain__lake", "dblog_maintain__ice"}
    dag = dags["dblog_maintain__lake"]
    assert dag.schedule == "0 3 * * *" and dag.max_active_runs == 1 and dag.description
    # the form submits with its defaults; every field has a title
    assert dag.params.validate() == {"tables": "", "retention_hours": 168, "dry_run": False, "z_order": False}
    assert all(dag.params.get_param(k).schema.get("title") for k in dag.params)
    task = dag.get_task("maintain")
    assert isinstance(task, DBLogMaintainOperator) and task.target == "lake"
    # the retention's minimum is what each kind's maintenance takes (targets/base.py)
    from airflow.sdk.exceptions import ParamValidationError
    for dag_id, least in (("dblog_maintain__lake", 168), ("dblog_maintain__ice", 1)):
        param = dags[dag_id].params.get_param("retention_hours")
        assert param.resolve(least) == least
        with pytest.raises(ParamValidationError, match=f"less than the minimum of {least}"):
            param.resolve(least - 1)
    assert build_dags(_config(tmp_path))["dblog_maintain__ice"].schedule == "@daily"
    with pytest.raises(ValueError, match="maintain_schedule must be"):
        build_dags(_config(tmp_path, maintain_schedule="event"))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_the_operator_compacts_a_lake_table_without_changing_it(dblog_setup, context, kind):
    from helpers import TailThread, lake_target
    from airflow_provider_dblog.engine.targets import open_target

    s = dblog_setup(ITEMS)
    (table,) = s.tables
    raw = yaml.safe_load(s.path.read_text())
    raw["targets"]["lake"] = lake_target(kind, s.path.parent / ("lake" if kind == "delta" else "warehouse"))
    s.path.write_text(yaml.safe_dump(raw))
    tail = TailThread(s).start()
    try:
        for i in range(8):   # one small apply each: one more file each
            s.execute("INSERT INTO items VALUES (%s, %s)", (i, f"v{i}"))
            tail.drain()
            assert run_apply(s.config, "lake", via="local")["tables"][table]["status"] == "applied"
    finally:
        tail.stop()
    schema = s.source().table_schema(table)
    with open_target(s.config.target("lake")) as target:
        try:
            rows, applied = target.rows(schema, with_pos=True), target.applied_pos("src", schema)
            op = DBLogMaintainOperator(task_id="maintain", config_path=str(s.path), target="lake",
                                       tables=table, retention_hours="200", dry_run="False")
            with pytest.raises(DBLogInvalidRequest, match="whole number of hours"):
                DBLogMaintainOperator(task_id="m", config_path=str(s.path), target="lake",
                                      retention_hours="1.5").execute(context)
            result = op.execute(context)
            (report,) = result["tables"].values()
            assert result["status"] == "done" and report["files_before"] >= 8 and report["files_after"] < 3, result
            assert target.rows(schema, with_pos=True) == rows and target.applied_pos("src", schema) == applied
            with pytest.raises(DBLogInvalidRequest, match="no table"):
                DBLogMaintainOperator(task_id="m", config_path=str(s.path), target="lake",
                                      tables="nope.nope").execute(context)
            with pytest.raises(DBLogInvalidRequest, match="dry_run must be true or false"):
                DBLogMaintainOperator(task_id="m", config_path=str(s.path), target="lake",
                                      dry_run="maybe").execute(context)
        finally:
            target.drop_all()
    # a PostgreSQL target: nothing to do, and the task says why
    pg = DBLogMaintainOperator(task_id="m", config_path=str(s.path), target="tgt").execute(context)
    assert pg["status"] == "nothing to do" and pg["tables"] == {} and "autovacuum" in pg["why"]
