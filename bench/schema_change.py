"""A nullable ADD COLUMN on a big table, online (issue 16).

    python -m bench.schema_change --rows 1000000 --source mysql --out /tmp/sc

A table of ``--rows`` rows (seeded outside the change log) is dumped into a PostgreSQL
target on Spark and applied, with ``dblog tail`` running as its own process. Then, in the
same set-up, twice each, alternating:

* baseline: one row updated, then ``dblog apply`` (in-process) until the target shows it;
* schema change: ``ALTER TABLE ... ADD COLUMN extra_<n> VARCHAR(20) NULL`` and one row
  given a value in it, then the same until the target has the column and that value;
* with a default: ``ADD COLUMN filled_<n> VARCHAR(20) NOT NULL DEFAULT 'd<n>'`` and another
  row updated, then the same until an old row neither touched shows the default in the
  target (its existing rows given the value the source gives them, without a rewrite).

Each time is from the statement's commit to the target showing it, and the result is the
ratio of the schema change's to the baseline's (medians). No re-dump: the check that none
ran is the dump request count, which stays at one. Writes ``schema-change.json`` under
``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path

import subprocess

from psycopg2 import sql

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.jobs import job_env
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.targets import PostgresTarget, target_table_name

from .env import Env, TailProcess, head_position
from .sources import open_bench_source

log = logging.getLogger("bench")
TABLE = "big"


def _target_value(env: Env, column: str, row_id: int):
    """The target's value of ``column`` for row ``row_id`` as text (None: no such column or row yet)."""
    with PostgresTarget(env.cfg.target("tgt")) as tgt, tgt.conn, tgt.conn.cursor() as cur:
        name = target_table_name(env.src_schema)
        cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s AND column_name = %s", (tgt.schema, name, column))
        if cur.fetchone() is None:
            return None
        cur.execute(sql.SQL("SELECT {}::text FROM {}.{} WHERE id = %s").format(
            sql.Identifier(column), sql.Identifier(tgt.schema), sql.Identifier(name)), (row_id,))
        row = cur.fetchone()
        return row[0] if row else None


def _until_target_has(env: Env, column: str, row_id: int, want: str, since: float, timeout: float = 300) -> float:
    """Apply (in-process) until the target's ``column`` of ``row_id`` is ``want``: seconds since ``since``."""
    deadline = time.monotonic() + timeout
    while True:
        run_apply(env.cfg, "tgt", via="local")
        if _target_value(env, column, row_id) == want:
            return time.monotonic() - since
        if time.monotonic() > deadline:
            raise RuntimeError(f"the target did not show {column}={want!r} for id {row_id} in {timeout}s")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.schema_change", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--source", choices=("mysql", "postgres"), default="mysql")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("/tmp/dblog-bench-schema"))
    p.add_argument("--keep", action="store_true", help="keep the set-up's files")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    src = open_bench_source(a.source, uuid.uuid4().hex[:6])
    src.setup()
    env = Env(src, "schema", [TABLE], a.out, target=True, dump={"chunk_size": 500_000})
    tail = None
    try:
        src.create_table(TABLE)
        t0 = time.monotonic()
        src.seed(TABLE, a.rows)
        seed_s = time.monotonic() - t0
        tail = TailProcess(env)
        source = open_source(env.cfg.source())
        env.src_schema = source.table_schema(src.qualified(TABLE))
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(env.path), "dump",
                        "--table", src.qualified(TABLE)], check=True, env=job_env(), capture_output=True)
        tail.drain(head_position(env))
        run_apply(env.cfg, "tgt", via="spark")
        load_s = time.monotonic() - t0
        conn = src.connect()
        baseline, change, alter, filled = [], [], [], []
        for i in range(a.repeat):
            row = 1 + (i * 7919) % a.rows
            with conn.cursor() as cur:
                since = time.monotonic()
                cur.execute(src.update_sql(TABLE), (1000 + i, row))
            baseline.append(_until_target_has(env, "wseq", row, str(1000 + i), since))
            col = f"extra_{i}"
            with conn.cursor() as cur:
                since = time.monotonic()
                cur.execute(f"ALTER TABLE {src.qualified(TABLE)} ADD COLUMN {col} VARCHAR(20) NULL")
                alter.append(time.monotonic() - since)
                cur.execute(f"UPDATE {src.qualified(TABLE)} SET {col} = %s WHERE id = %s", (f"v{i}", row))
            env.src_schema = source.refresh_schema(src.qualified(TABLE))
            change.append(_until_target_has(env, col, row, f"v{i}", since))
            col, old_row = f"filled_{i}", 1 + (i * 104729 + 13) % a.rows
            with conn.cursor() as cur:
                since = time.monotonic()
                cur.execute(f"ALTER TABLE {src.qualified(TABLE)} ADD COLUMN {col} VARCHAR(20) NOT NULL DEFAULT 'd{i}'")
                # another row written after it (PostgreSQL's log shows the change with the next row change)
                cur.execute(src.update_sql(TABLE), (2000 + i, row))
            env.src_schema = source.refresh_schema(src.qualified(TABLE))
            filled.append(_until_target_has(env, col, old_row, f"d{i}", since))
        requests = len(env.state.requests(limit=100))
        result = {"source": a.source, "rows": a.rows, "seed_s": round(seed_s, 1), "load_s": round(load_s, 1),
                  "alter_at_source_s": [round(x, 3) for x in alter],
                  "baseline_s": [round(x, 3) for x in baseline], "schema_change_s": [round(x, 3) for x in change],
                  "ratio": round(statistics.median(change) / statistics.median(baseline), 2),
                  "with_default_s": [round(x, 3) for x in filled],
                  "with_default_ratio": round(statistics.median(filled) / statistics.median(baseline), 2),
                  "dump_requests": requests}
        (a.out / "schema-change.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if tail is not None:
            tail.stop()
        env.close(a.keep)
        src.teardown()


if __name__ == "__main__":
    sys.exit(main())
