"""The steps the lake break rounds share (tests/integration/test_lake_break6.py, 7): a dump
run in-process, applies until up to date, a lake table's changelog read and replayed, the
source's rows, a verification beside running applies. Real servers, no mocks."""
from __future__ import annotations

import json
import threading

from deltalake import DeltaTable

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets.changelog import changelog_name
from airflow_provider_dblog.engine.verify_run import run_verify

MARKERS = ("sweep", "rebuild")


def ok(res) -> None:
    assert res["status"] in ("applied", "up_to_date", "empty"), json.dumps(res, default=str)


def dump(cdc, spec: DumpSpec, max_chunks: int | None = None) -> str:
    """A dump request run in this process (``max_chunks``: stopped after that many); done,
    then drained."""
    rid = cdc.request(spec)
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid, max_chunks)
    if max_chunks is None:
        assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
        cdc.drain()
    return rid


def apply_all(cdc, target: str, table: str, runs: int = 6, via: str = "local") -> dict:
    """Applies until the table is up to date (a batch ends at each change; one run takes
    every change up to the frontier, a second says so)."""
    res = None
    for _ in range(runs):
        res = (cdc.apply_local(target) if via == "local" else cdc.apply_spark(target)["tables"])[table]
        if res["status"] != "applied":
            break
    return res


def changelog(target, schema) -> list[dict]:
    """The table's changelog rows in the README's order (a marker after the event at its position)."""
    name = changelog_name(schema)
    if target.config.kind == "delta":
        data = DeltaTable(f"{target.root}/{name}").to_pyarrow_table()
    else:
        data = target.catalog.load_table((target.namespace, name)).scan().to_arrow()
    return sorted(data.to_pylist(), key=lambda r: (r["_dblog_pos"], r["op"] in MARKERS))


def replay(log: list[dict], cols: list[str], key: str = "id") -> list[tuple]:
    """The rows a reader gets by replaying a changelog: a truncate or rebuild empties, a
    delete or sweep removes its key, any other row sets its key's after image."""
    state: dict = {}
    for r in log:
        if r["op"] in ("truncate", "rebuild"):
            state.clear()
        elif r["op"] in ("delete", "sweep"):
            state.pop(r["before"][key], None)
        else:
            state[r["after"][key]] = tuple(r["after"][c] for c in cols)
    return [state[k] for k in sorted(state)]


def source_rows(src_db, table: str, cols: list[str], key: str = "id") -> list[tuple]:
    q = (lambda n: "`" + n.replace("`", "``") + "`") if src_db.kind == "mysql" else \
        (lambda n: '"' + n.replace('"', '""') + '"')
    with src_db.cursor() as cur:
        cur.execute(f"SELECT {', '.join(q(c) for c in cols)} FROM {table} ORDER BY {q(key)}")
        return [tuple(r) for r in cur.fetchall()]


def verify(cdc, target: str, table: str) -> dict:
    """``dblog verify`` of one table (run_verify, chunks read in-process) while applies run
    beside it (it waits for the target to reach its chunks' HW)."""
    stop, errors = threading.Event(), []

    def applying():
        while not stop.is_set():
            try:
                cdc.apply_local(target)
            except Exception as e:  # noqa: BLE001 - surfaced below
                errors.append(e)
            stop.wait(0.3)
    th = threading.Thread(target=applying, daemon=True)
    th.start()
    try:
        return run_verify(cdc.cfg, target, DumpSpec("table", [table]), wait_s=60)
    finally:
        stop.set()
        th.join(60)
        assert not errors, errors
