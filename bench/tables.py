"""Many captured tables (issue 30): what 1,000 tables cost where the count could show.

    python -m bench.tables --tables 1000 --out /tmp/bt

In one run, against the private servers (MariaDB source, PostgreSQL target, Redis), each
ratio against a baseline measured in the same run:

* parse: the shipped DAG file (``dags/dblog_dags.py``) imported in a fresh process with
  ``DBLOG_CONFIG`` naming a config of ``--tables`` tables, vs one of 3 (the demo's size):
  seconds of the file's import (Airflow imported before the clock starts), and of
  Airflow's ``DagBag`` of the file; goal < 5 s at 1,000 tables (Airflow's DAG-file import
  timeout is 30 s);
* tail: ``Tail.run`` over ``--tail-events`` row changes written to 10 tables, with
  ``--tables`` captured vs the same 10 captured; a first run records the tables' schema
  versions (``cold``), the measured one reads the same range again from the same
  checkpoint (``warm``); goal events/s >= 0.9x;
* apply: ``dblog apply`` in-process (``via local``) of ``--changed`` tables changed
  (``--rows`` updates each) among ``--tables`` captured vs among 10 captured (a ``dblog
  tail`` process per set-up, drained before each timed apply; every table written once
  before, so each has log files), ``--repeat`` times, alternating; goal seconds <= 2x.

Database ``bench_<run>`` (tables ``t0000``...), Redis prefixes ``bench_<run>_<set-up>``,
target databases ``bench_<run>_<set-up>``: all dropped at the end. Writes ``results.json``
and ``results.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.sources.mysql import binlog_file_number
from airflow_provider_dblog.engine.tail import Tail

from .env import PG, REDIS_URL, Env, TailProcess, head_position
from .sources import open_bench_source

log = logging.getLogger("bench")
REPO = Path(__file__).resolve().parents[1]
DAG_FILE = REPO / "dags" / "dblog_dags.py"
SMALL = 10   # the baseline's captured tables (tail, apply)
REFERENCE = 3   # the parse baseline's tables (the demo's source)

_PARSE = """
import json, os, sys, time
import airflow.sdk  # (imported before the clock starts, as in Airflow's DAG processor)
sys.path.insert(0, {dags!r})
how = sys.argv[1]
t0, c0 = time.perf_counter(), time.process_time()
if how == "import":
    import runpy
    n = sum(1 for k in runpy.run_path({file!r}) if k.startswith("dblog_"))
    errors = {{}}
else:
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder={file!r}, safe_mode=False)
    n, errors = len(bag.dag_ids), {{k: str(v)[-300:] for k, v in bag.import_errors.items()}}
print(json.dumps({{"seconds": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3),
                  "dags": n, "errors": errors}}))
"""


def table_names(n: int) -> list[str]:
    return [f"t{i:04d}" for i in range(n)]


def parse_config(path: Path, qualified: list[str], prefix: str) -> Path:
    """A config of one MySQL source capturing ``qualified`` and a PostgreSQL target: only its
    shape matters to the factory (nothing is connected at parse but Redis, for the control form)."""
    raw = {"sources": {"src": {"kind": "mysql", "host": "127.0.0.1", "port": 13306, "user": "root",
                               "tables": qualified}},
           "targets": {"tgt": {"kind": "postgres", "source": "src", **PG, "database": "unused"}},
           "state": {"redis_url": REDIS_URL, "prefix": prefix}, "storage": {"root": str(path.parent / "storage")}}
    path.write_text(yaml.safe_dump(raw))
    return path


def parse_once(config: Path, how: str) -> dict:
    """The DAG file's parse in a fresh process (``how``: ``import`` or ``dagbag``)."""
    home = config.parent / "airflow-home"
    home.mkdir(exist_ok=True)
    env = os.environ | {"DBLOG_CONFIG": str(config), "AIRFLOW_HOME": str(home),
                        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", _PARSE.format(dags=str(DAG_FILE.parent), file=str(DAG_FILE)), how],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(f"parse of {DAG_FILE} with {config} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out["errors"]:
        raise RuntimeError(f"import errors: {out['errors']}")
    return out


def parse_phase(a, src, workdir: Path) -> dict:
    out: dict = {}
    d = workdir / "parse"
    d.mkdir(parents=True, exist_ok=True)
    for label, n in (("reference", REFERENCE), ("many", a.tables)):
        cfg = parse_config(d / f"parse-{n}.yaml", [src.qualified(t) for t in table_names(n)],
                           f"bench_{src.run_id}_parse")
        runs = {how: [parse_once(cfg, how) for _ in range(a.parse_repeat)] for how in ("import", "dagbag")}
        out[label] = {"tables": n, "dags": runs["import"][0]["dags"],
                      "import_s": round(statistics.median(r["seconds"] for r in runs["import"]), 2),
                      "import_cpu_s": round(statistics.median(r["cpu_s"] for r in runs["import"]), 2),
                      "dagbag_s": round(statistics.median(r["seconds"] for r in runs["dagbag"]), 2),
                      "runs": runs}
        log.info("parse: %d tables, %d DAGs: import %.2fs (CPU %.2fs), DagBag %.2fs", n, out[label]["dags"],
                 out[label]["import_s"], out[label]["import_cpu_s"], out[label]["dagbag_s"])
    out["ratio"] = round(out["many"]["import_s"] / out["reference"]["import_s"], 2)
    out["goal_s"] = 5.0
    out["ok"] = out["many"]["import_s"] < 5.0 and out["many"]["dagbag_s"] < 5.0
    return out


# -- tail ----------------------------------------------------------------------------
def write_rows(src, tables: list[str], rows: int, txn_rows: int, first_id: int = 1) -> None:
    """``rows`` inserts into each of ``tables``, in transactions of ``txn_rows`` rows."""
    conn = src.connect()
    try:
        with conn.cursor() as cur:
            for t in tables:
                for lo in range(first_id, first_id + rows, txn_rows):
                    hi = min(first_id + rows, lo + txn_rows)
                    cur.execute("BEGIN")
                    cur.executemany(src.insert_sql(t), [(i, i) for i in range(lo, hi)])
                    cur.execute("COMMIT")
    finally:
        conn.close()


def update_rows(src, tables: list[str], rows: int, wseq: int) -> None:
    """``rows`` updates (ids 1..rows) of each of ``tables``, one transaction per table."""
    conn = src.connect()
    try:
        with conn.cursor() as cur:
            for t in tables:
                cur.execute("BEGIN")
                cur.executemany(src.update_sql(t), [(wseq, i) for i in range(1, rows + 1)])
                cur.execute("COMMIT")
    finally:
        conn.close()


def _tail_run(env: Env, start: Position, resume: dict, n: int, profile: Path | None = None) -> dict:
    token = env.state.acquire_lease("bench-seed", 30)
    env.state.commit(token, start, resume, [], 0)
    env.state.release_lease(token)
    tail = Tail(open_source(env.cfg.source()), env.state, env.store, env.cfg.tail, owner="bench", dump=env.cfg.dump)
    t0 = time.monotonic()
    try:
        if profile is None:
            stats = tail.run(max_events=n)
        else:
            import cProfile
            prof = cProfile.Profile()
            stats = prof.runcall(tail.run, max_events=n)
            prof.dump_stats(str(profile))
    finally:
        tail.source.close()
    wall = time.monotonic() - t0
    return {"events": stats.events, "seconds": round(wall, 3), "events_per_s": round(stats.events / wall, 1)}


def tail_phase(a, src, workdir: Path, names: list[str]) -> dict:
    written = names[:SMALL]
    envs = {"many": Env(src, "tailmany", names, workdir), "small": Env(src, "tailsmall", written, workdir)}
    try:
        end = src.log_end()
        start, resume = Position(binlog_file_number(end["file"]), end["pos"], 0), end
        per = a.tail_events // len(written)
        write_rows(src, written, per, a.txn_rows, first_id=1_000_001)
        n = per * len(written)
        out: dict = {"events": n, "written_tables": len(written)}
        for label, env in envs.items():
            cold = _tail_run(env, start, resume, n)
            warm = [_tail_run(env, start, resume, n, a.out / f"tail-{label}-{i}.prof" if a.profile else None)
                    for i in range(a.repeat)]
            out[label] = {"tables": len(env.cfg.source().tables), "cold": cold, "warm": warm,
                          "events_per_s": statistics.median(w["events_per_s"] for w in warm)}
            log.info("tail: %d captured: %s events/s (cold run %s events/s)", out[label]["tables"],
                     out[label]["events_per_s"], cold["events_per_s"])
        out["ratio"] = round(out["many"]["events_per_s"] / out["small"]["events_per_s"], 2)
        out["goal"], out["ok"] = 0.9, out["ratio"] >= 0.9
        return out
    finally:
        for env in envs.values():
            env.close(a.keep)


# -- apply ---------------------------------------------------------------------------
def apply_phase(a, src, workdir: Path, names: list[str]) -> dict:
    changed = names[:a.changed]
    envs = {"many": Env(src, "applymany", names, workdir, target=True),
            "small": Env(src, "applysmall", names[:max(SMALL, a.changed)], workdir, target=True)}
    tails: dict[str, TailProcess] = {}
    try:
        for label, env in envs.items():
            tails[label] = TailProcess(env)
        write_rows(src, changed, a.rows, a.txn_rows, first_id=1)   # the rows the timed runs update
        write_rows(src, names, 1, 1, first_id=2_000_000)   # and a row in every table: each has a log file
        head = head_position(envs["many"])
        first = {}
        for label, env in envs.items():
            tails[label].drain(head)
            t0 = time.monotonic()
            res = run_apply(env.cfg, "tgt", via="local")   # creates every target table
            first[label] = {"seconds": round(time.monotonic() - t0, 3), "events": res["events"]}
            log.info("apply: first run, %d tables: %.2fs", len(env.cfg.source().tables), first[label]["seconds"])
        runs: dict[str, list[dict]] = {"many": [], "small": []}
        for i in range(a.repeat):
            update_rows(src, changed, a.rows, 10 + i)
            head = head_position(envs["many"])
            for label in (("many", "small") if i % 2 == 0 else ("small", "many")):
                tails[label].drain(head)
                t0 = time.monotonic()
                res = _timed_apply(envs[label].cfg, a.out / f"apply-{label}-{i}.prof" if a.profile else None, a.via)
                secs = time.monotonic() - t0
                touched = [t for t, r in res["tables"].items() if r.get("events")]
                runs[label].append({"seconds": round(secs, 3), "events": res["events"], "tables_with_events": len(touched)})
                log.info("apply %d, %s: %.3fs, %d events in %d tables", i, label, secs, res["events"], len(touched))
        out: dict = {"changed": len(changed), "rows": a.rows, "via": a.via, "first_run": first}
        for label, env in envs.items():
            out[label] = {"tables": len(env.cfg.source().tables), "runs": runs[label],
                          "seconds": round(statistics.median(r["seconds"] for r in runs[label]), 3)}
        out["ratio"] = round(out["many"]["seconds"] / out["small"]["seconds"], 2)
        out["goal"], out["ok"] = 2.0, out["ratio"] <= 2.0
        return out
    finally:
        for t in tails.values():
            t.stop()
        for env in envs.values():
            env.close(a.keep)


def _timed_apply(cfg, profile: Path | None, via: str = "local") -> dict:
    """An apply run in this process (``via`` "auto": as the operator runs it, the path chosen
    first); with ``profile``, under cProfile (stats written there)."""
    if profile is None:
        return run_apply(cfg, "tgt", via=via)
    import cProfile
    prof = cProfile.Profile()
    try:
        return prof.runcall(run_apply, cfg, "tgt", via=via)
    finally:
        prof.dump_stats(str(profile))


def report(res: dict) -> str:
    p, t, ap = res.get("parse"), res.get("tail"), res.get("apply")
    lines = [f"# dblog with {res['tables']} captured tables ({res['started']})", "",
             "| measure | many | baseline | ratio | goal | ok |", "|---|---|---|---|---|---|"]
    if p:
        lines.append(f"| DAG file import, {p['many']['tables']} vs {p['reference']['tables']} tables "
                     f"({p['many']['dags']} / {p['reference']['dags']} DAGs) | {p['many']['import_s']} s "
                     f"(CPU {p['many']['import_cpu_s']} s) | {p['reference']['import_s']} s | {p['ratio']} | "
                     f"< 5 s | {p['ok']} |")
        lines.append(f"| DagBag of the file | {p['many']['dagbag_s']} s | {p['reference']['dagbag_s']} s | "
                     f"{round(p['many']['dagbag_s'] / p['reference']['dagbag_s'], 2)} | < 5 s | {p['ok']} |")
    if t:
        lines.append(f"| tail events/s, writes to {t['written_tables']} tables, {t['many']['tables']} vs "
                     f"{t['small']['tables']} captured | {t['many']['events_per_s']} | {t['small']['events_per_s']} | "
                     f"{t['ratio']} | >= 0.9x | {t['ok']} |")
    if ap:
        lines.append(f"| apply s (via {ap.get('via', 'local')}), {ap['changed']} tables changed, {ap['many']['tables']} vs "
                     f"{ap['small']['tables']} captured | {ap['many']['seconds']} | {ap['small']['seconds']} | "
                     f"{ap['ratio']} | <= 2x | {ap['ok']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=1000)
    p.add_argument("--only", default="parse,tail,apply", help="comma-separated: parse, tail, apply")
    p.add_argument("--tail-events", type=int, default=20_000)
    p.add_argument("--txn-rows", type=int, default=10)
    p.add_argument("--changed", type=int, default=10)
    p.add_argument("--rows", type=int, default=100, help="updates per changed table per apply run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--parse-repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("/tmp/dblog-bench-tables"))
    p.add_argument("--keep", action="store_true")
    p.add_argument("--via", choices=("local", "auto"), default="local",
                   help="the timed apply runs' path: local, or auto (counted first, as the operator runs it)")
    p.add_argument("--profile", action="store_true", help="cProfile each timed tail and apply run (tail-*.prof, apply-*.prof under --out)")
    a = p.parse_args(argv)
    if not 1 <= a.changed <= SMALL:
        p.error(f"--changed must be 1..{SMALL} (the baseline captures {SMALL} tables)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    phases = {x.strip() for x in a.only.split(",") if x.strip()}
    src = open_bench_source("mysql", uuid.uuid4().hex[:6])
    res: dict = {"tables": a.tables, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "source": "mysql"}
    src.setup()
    try:
        names = table_names(max(a.tables, SMALL))
        if "parse" in phases:
            res["parse"] = parse_phase(a, src, a.out / "work")
        if phases & {"tail", "apply"}:
            t0 = time.monotonic()
            for t in names:
                src.create_table(t)
            res["create_tables_s"] = round(time.monotonic() - t0, 1)
        if "tail" in phases:
            res["tail"] = tail_phase(a, src, a.out / "work", names)
        if "apply" in phases:
            res["apply"] = apply_phase(a, src, a.out / "work", names)
    finally:
        src.teardown()
    (a.out / "results.json").write_text(json.dumps(res, indent=2))
    (a.out / "results.md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
