"""1,000 captured tables (issue 30): the shipped factory builds a DAG per table that every
part of Airflow can resolve, within a budget of static chunk groups per file (counts, not
seconds: the seconds are ``python -m bench.tables``)."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

DAGS = Path(__file__).resolve().parents[2] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))


# -- the DAGs ------------------------------------------------------------------------
def _dag_config(tmp_path, tables: list[str], airflow: dict | None = None) -> str:
    raw = {"sources": {"src": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": tables}},
           "targets": {"wh": {"kind": "postgres", "source": "src", "host": "h", "port": 2, "user": "u"}},
           "state": {"redis_url": "redis://127.0.0.1:1/0"}, "storage": {"root": str(tmp_path)},
           "dump": {"chunk_size": 1234, "parallelism": 3}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw | ({"airflow": airflow} if airflow else {})))
    return str(path)


def test_a_thousand_tables_build_a_dump_dag_each_that_resolves(tmp_path):
    from airflow.sdk.definitions.param import process_params
    from dblog_factory import build_dags
    tables = [f"db{i % 7}.t{i:04d}" for i in range(1000)]
    dags = build_dags(_dag_config(tmp_path, tables))
    dumps = {f"dblog_dump__src__{t.replace('.', '__')}": t for t in tables}
    assert set(dags) == set(dumps) | {"dblog_tail__src", "dblog_repair__src", "dblog_dump_control__src",
                                      "dblog_verify__src", "dblog_apply__wh"}
    assert dags["dblog_repair__src"].params.get_param("table").schema["enum"] == tables
    for dag_id, table in dumps.items():
        dag = dags[dag_id]
        # one chunk group a run at this size (a run triggers the next: chunk_groups)
        assert [t.task_id for t in dag.topological_sort()] == [
            "create_request", "chunk_01.select", "chunk_01.wait_hw", "chunk_01.reconcile", "chunks_left", "next_run"]
        create = dag.get_task("create_request")
        assert create.table == table and dag.get_task("next_run").trigger_dag_id == dag_id
        # the form's params are the DAG's, and each task's run gets them merged with the conf,
        # which leaves the DAG's defaults as they were (for the next run in the same process)
        assert process_params(dag, create, {"chunk_size": 7}, suppress_exception=False) == {
            "request_id": None, "chunk_size": 7, "parallelism": 3}
        assert dag.params.validate() == {"request_id": None, "chunk_size": 1234, "parallelism": 3}
    # the same DAGs as Airflow serializes them (what the scheduler and the UI read)
    from airflow.serialization.serialized_objects import DagSerialization
    one = DagSerialization.from_dict(DagSerialization.to_dict(dags["dblog_dump__src__db3__t0003"]))
    assert one.params.get_param("chunk_size").value == 1234 and len(one.tasks) == 6


@settings(max_examples=25, deadline=None)
@given(tables=st.integers(1, 5000), per_run=st.one_of(st.none(), st.integers(1, 20)))
def test_chunk_groups_per_run_stay_within_the_budget(tables, per_run):
    from dblog_factory import CHUNK_GROUP_BUDGET, CHUNK_GROUPS, chunk_groups
    groups = chunk_groups({"chunks_per_run": per_run}, tables)
    if per_run is not None:
        assert groups == per_run   # an explicit number wins
    else:
        assert 1 <= groups <= CHUNK_GROUPS
        assert groups == 1 or tables * groups <= CHUNK_GROUP_BUDGET   # within the budget (one at least)
        assert groups == CHUNK_GROUPS or tables * (groups + 1) > CHUNK_GROUP_BUDGET   # as many as it allows


def test_a_few_tables_keep_ten_chunk_groups_a_run(tmp_path):
    from dblog_factory import build_dags
    dags = build_dags(_dag_config(tmp_path, [f"d.t{i}" for i in range(100)]))
    assert len(dags["dblog_dump__src__d__t7"].tasks) == 1 + 3 * 10 + 2
    dags = build_dags(_dag_config(tmp_path, [f"d.t{i}" for i in range(1000)], {"chunks_per_run": 3}))
    assert len(dags["dblog_dump__src__d__t7"].tasks) == 1 + 3 * 3 + 2
