"""Breaking the apply run's survey (engine/apply_survey.py) on the real servers: the real
tail writes the events (MariaDB; the control on PostgreSQL too), and a run with the survey on target ``tgt`` must leave
what a run without it (every table through ``plan_table``) leaves on its twin ``tgt2``
(rows, columns, checkpoints, per-table results); one table's trouble must stop only that
table, as it does without the survey.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine import apply_run
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.apply_survey import Survey
from airflow_provider_dblog.engine.errors import TablesNotAppliedError
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.targets import PostgresTarget, open_target, target_table_name

from helpers import POSTGRES_PORT, drop_pg_database, unique

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
NOT_COMPARED = {"seconds", "via", "read_s", "stage_s", "merge_s", "rows_per_s", "spark_s", "uri", "retries"}


@pytest.fixture
def twin_db(servers):
    """The twins' target database (first in each test's fixtures: dropped after the CDC's
    close, whose target clean-up would create it again)."""
    name = unique("svbrk")
    yield name
    drop_pg_database(name)


def _targets(database: str, kind: str, tmp_path) -> dict:
    """Twin targets: ``tgt`` (applied with the survey) and ``tgt2`` (without)."""
    if kind == "delta":
        return {"targets": {n: {"kind": "delta", "source": "src", "path": str(tmp_path / f"lake_{n}")}
                            for n in ("tgt", "tgt2")}}
    pg = {"kind": "postgres", "source": "src", "host": "127.0.0.1", "port": POSTGRES_PORT, "user": "postgres",
          "database": database}
    return {"targets": {"tgt": pg | {"schema": "with_survey"}, "tgt2": pg | {"schema": "without"}}}


def _no_survey(target, store, state, source_name, tables) -> Survey:
    return Survey(state.frontier())


QUIET: list[dict] = []   # what each run's survey found quiet


def _run(cdc, target: str, survey: bool) -> dict:
    """One local apply run: {table: result} (a TablesNotAppliedError's results too)."""
    with pytest.MonkeyPatch.context() as mp:
        if not survey:
            mp.setattr(apply_run, "survey", _no_survey)
        else:
            real = apply_run.survey
            mp.setattr(apply_run, "survey", lambda *a: (found := real(*a), QUIET.append(found.quiet))[0])
        try:
            res = run_apply(cdc.cfg, target, via="local")["tables"]
        except TablesNotAppliedError as e:
            res = e.results
        except Exception as e:   # noqa: BLE001 - the whole run stopped: no table's result
            return {"run stopped": f"{type(e).__name__}: {e}"}
    said = {t: {k: v for k, v in r.items() if k not in NOT_COMPARED} for t, r in res.items()}
    return json.loads(json.dumps(said).replace("target tgt2 ", "target T ").replace("target tgt ", "target T "))


def _seen(cdc, target: str, tables: list[str]) -> dict:
    """Per table: its target table's columns and rows, and its checkpoint."""
    tcfg = cdc.cfg.target(target)
    out = {}
    if tcfg.kind != "postgres":
        with open_target(tcfg) as tgt:
            for n in tables:
                t = f"{cdc.db}.{n}"
                rows = (sorted(map(str, tgt.read(t).drop_columns(["_dblog_pos"]).to_pylist()))
                        if tgt.exists(t) else None)
                out[t] = {"columns": tgt.columns(t), "rows": rows, "applied": tgt.applied_pos("src", t)}
        return out
    with PostgresTarget(tcfg) as tgt:
        applied = {n: tgt.applied_pos("src", f"{cdc.db}.{n}") for n in tables}
        cur = tgt.conn.cursor()
        for n in tables:
            t = f"{cdc.db}.{n}"
            name = target_table_name(t)
            cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = %s ORDER BY ordinal_position", (tcfg.schema, name))
            cols = cur.fetchall()
            rows = None
            if cols:
                cur.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(tcfg.schema, name)))
                rows = [tuple(map(str, r)) for r in cur.fetchall()]
            out[t] = {"columns": cols, "rows": rows, "applied": applied[n]}
        tgt.conn.rollback()
    return out


def twins(cdc, tables: list[str]) -> tuple[tuple[dict, dict], tuple[dict, dict]]:
    """Both targets applied at the same frontier (the tail stopped meanwhile): what each
    run said and what each target holds, with the survey on ``tgt``, without on ``tgt2``."""
    cdc.drain()
    cdc.stop_tail()
    try:
        got, want = _run(cdc, "tgt", True), _run(cdc, "tgt2", False)
        return (got, _seen(cdc, "tgt", tables)), (want, _seen(cdc, "tgt2", tables))
    finally:
        cdc.start_tail()


def _setup(twin_db, src_db, make_cdc, tables: list[str], kind: str = "postgres", tmp_path=None, **overrides):
    """Tables with a row each, dumped, a row more each, applied to both twins alike."""
    with src_db.cursor() as cur:
        for n in tables:
            src_db.create_table(cur, n, "id INT PRIMARY KEY, v INT")
            cur.execute(f"INSERT INTO {n} VALUES (1, 1)")
    cdc = make_cdc(tables, **_targets(twin_db, kind, tmp_path), **overrides)
    cdc.start_tail()
    for n in tables:
        cdc.dump_local(n)
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 2)")
    a, b = twins(cdc, tables)
    assert a == b
    return cdc


def _damage_latest_file(cdc, table: str) -> str:
    """Cut the table's latest log file in half (a damaged file in the store)."""
    files = sorted(i.path for i in cdc.store._files(cdc.store.table_dir(f"{cdc.db}.{table}"))
                   if i.base_name.startswith("log-"))
    with open(files[-1], "r+b") as f:
        f.truncate(len(f.read()) // 2)
    return files[-1]


KINDS = pytest.mark.parametrize("kind", ["postgres", "delta"])


def _damage_delta_log(cdc, target: str, table: str) -> None:
    """Cut the latest commit of the table's Delta log short (a damaged lake table)."""
    root = cdc.cfg.target(target).path
    logs = sorted(Path(root, target_table_name(f"{cdc.db}.{table}"), "_delta_log").glob("*.json"))
    logs[-1].write_bytes(logs[-1].read_bytes()[:10])


@MARIADB
@KINDS
def test_a_damaged_file_of_one_table_stops_only_that_table(twin_db, src_db, make_cdc, tmp_path, kind):
    """One table's file in the store that cannot be read (cut short): without the survey
    that table fails and the others are applied (TablesNotAppliedError names it); the survey
    read its Parquet footer for all tables at once, and its error stopped the whole run (no
    table applied, the raw ArrowInvalid instead of the run's per-table result)."""
    tables = ["a", "b"]
    cdc = _setup(twin_db, src_db, make_cdc, tables, kind, tmp_path)
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (3, 3)")
    cdc.drain()
    _damage_latest_file(cdc, "b")
    (got, seen), (want, seen2) = twins(cdc, tables)
    assert want[f"{cdc.db}.a"]["status"] == "applied" and want[f"{cdc.db}.b"]["status"] == "failed", want
    assert got == want
    assert seen == seen2


@MARIADB
def test_a_damaged_lake_table_stops_only_itself(twin_db, src_db, make_cdc, tmp_path):
    """One Delta table whose log cannot be read (its latest commit cut short): without the
    survey that table fails and the others are applied; the survey asked every table's
    checkpoint at once, and that one's error stopped the whole run."""
    tables = ["a", "b", "c"]
    cdc = _setup(twin_db, src_db, make_cdc, tables, "delta", tmp_path)
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO a VALUES (3, 3)")   # b and c quiet
    cdc.drain()
    for target in ("tgt", "tgt2"):
        _damage_delta_log(cdc, target, "b")
    (got, seen), (want, seen2) = twins(cdc, [n for n in tables if n != "b"])
    assert want[f"{cdc.db}.a"]["status"] == "applied" and want[f"{cdc.db}.b"]["status"] == "failed", want
    assert got == want
    assert seen == seen2


@MARIADB
@KINDS
def test_a_quiet_checkpoint_is_not_moved_over_another_runs_reset(twin_db, src_db, make_cdc, tmp_path, kind):
    """Two apply runs of one target at once (a repair beside the scheduled apply). Run X's
    survey finds ``a`` quiet; before X moves the quiet checkpoints, ``a``'s target table is
    dropped by hand and run Y plans it: it forgets the checkpoint and re-applies from the
    start of the log. X's move put a checkpoint back under Y's batch, whose merge keeps
    only events from the checkpoint on: the rows before it were lost for good (the next
    apply starts from X's checkpoint)."""
    from airflow_provider_dblog.engine.apply_batch import LocalApplier
    from airflow_provider_dblog.engine.apply_plan import plan_table

    tables = ["a", "b"]
    cdc = _setup(twin_db, src_db, make_cdc, tables, kind, tmp_path)
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO b VALUES (3, 3)")   # only b changes: a is quiet
    cdc.drain()
    cdc.stop_tail()
    tcfg, schema = cdc.cfg.target("tgt"), cdc.source.table_schema(f"{cdc.db}.a")
    real, raced = apply_run.advance_applied_many, []

    def racing(target, source, names, pos):
        with open_target(tcfg) as other:   # run Y, on its own connection
            if kind == "delta":   # by hand, in the lake
                shutil.rmtree(Path(tcfg.path, target_table_name(schema)))
            else:   # by hand, in the warehouse
                with other.conn, other.conn.cursor() as cur:
                    cur.execute(sql.SQL("DROP TABLE {}").format(
                        sql.Identifier(tcfg.schema, target_table_name(schema))))
            batch = plan_table(other, cdc.store, cdc.state, "src", schema)   # reset, from the start
            real(target, source, names, pos)   # run X moves its quiet tables' checkpoints
            raced.append(LocalApplier(other, cdc.store, cdc.state, "src").apply_batch(batch))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apply_run, "advance_applied_many", racing)
        run_apply(cdc.cfg, "tgt", via="local")
    assert raced and raced[0]["from"] is None, raced
    assert len(_seen(cdc, "tgt", ["a"])[f"{cdc.db}.a"]["rows"]) == 2   # (1, 1) and (2, 2)
    cdc.start_tail()


def test_the_real_tails_changes_give_the_same_targets(twin_db, src_db, make_cdc):
    """Control, on both sources: the real tail's events and versions (rows, TRUNCATE, an
    added column, one under ``ignore``, a rename away, quiet tables, a dump of a quiet table
    and its sweep, an open dump window holding the frontier below the checkpoints): both
    twins alike, run after run."""
    tables = ["a", "b", "c", "d", "e", "f", "g"]
    db = src_db.name
    cdc = _setup(twin_db, src_db, make_cdc, tables,
                 source={"schema_changes": {"default": "evolve", f"{db}.g": "ignore"}})
    rename = "RENAME TABLE d TO d_old" if src_db.kind == "mysql" else "ALTER TABLE d RENAME TO d_old"
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO a VALUES (3, 3)")
        cur.execute("TRUNCATE TABLE b")
        for n in ("c", "g"):
            cur.execute(f"ALTER TABLE {n} ADD COLUMN w INT DEFAULT 7")
            cur.execute(f"INSERT INTO {n} (id, v) VALUES (3, 3)")   # (PostgreSQL: its Relation comes with a row)
        cur.execute(rename)
    cdc.dump_local("e")
    QUIET.clear()
    for _ in range(2):
        a, b = twins(cdc, tables)
        assert a == b
    assert set(QUIET[0]) == {f"{db}.f"}, QUIET
    assert set(QUIET[1]) >= {f"{db}.{n}" for n in "abcefg"}, QUIET
    window = cdc.state.open_window("r-test", f"{db}.a", Position(0, 0))
    try:   # the frontier below every checkpoint: every table up to date, both ways
        with src_db.cursor() as cur:
            cur.execute("INSERT INTO a VALUES (4, 4)")
        a, b = twins(cdc, tables)
        assert a == b
        assert set(QUIET[-1]) >= {f"{db}.{n}" for n in "abcefg"}, QUIET
    finally:
        cdc.state.close_window(window, "test")
    a, b = twins(cdc, tables)
    assert a == b
