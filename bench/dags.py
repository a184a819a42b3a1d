"""Phase ``dags``: freshness through the shipped DAGs in a running Airflow (issue 14).

For each mode (``--dags-modes``: ``event``, the default ``apply_schedule``, and ``cron``,
the ``--dags-cron`` schedule the DAGs shipped with before), one isolated set-up (its own
table, Redis prefix, storage and target) and one RunningAirflow (api-server, scheduler,
dag-processor, triggerer, LocalExecutor, SQLite: ``devenv/running_airflow.py``) serving
``dags/dblog_factory.py``'s DAGs: the continuous tail DAG and the apply DAG. A writer
process commits single-row changes at ``--dags-rate`` per second for the mode's minutes.

Freshness of a change = first time the target's applied position (moved in the merge's
own transaction, so the row is visible from then on; sampled at 10 Hz) passed the
change's event, minus its commit. Every change is measured: after the writes the phase
waits until the target has applied everything the tail read.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import yaml

from airflow_provider_dblog.devenv.running_airflow import RunningAirflow, wait_until

from .env import Env, head_position
from .metrics import Timeline, positions_by_wseq, ratio, summary
from .workload import Writer

log = logging.getLogger("bench")

DAGS = Path(__file__).resolve().parents[1] / "dags"
TAIL, APPLY = "dblog_tail__src", "dblog_apply__tgt"
SEED_ROWS = 1000
DAG_FILE = '''# an airflow DAG file (safe mode parses files naming both): the shipped factory's DAGs
import sys
sys.path.insert(0, {dags!r})
from dblog_factory import build_dags
globals().update(build_dags({config!r}))
'''


def dags(a, src, workdir: Path) -> dict:
    out: dict = {"rate_per_s": a.dags_rate, "tail_run_seconds": a.dags_tail_run_seconds, "modes": {}}
    for mode in [m.strip() for m in a.dags_modes.split(",") if m.strip()]:
        schedule = "event" if mode == "event" else a.dags_cron
        minutes = a.dags_minutes if mode == "event" else a.dags_cron_minutes
        log.info("dags: %s (apply_schedule %r), %.1f min of writes at %g/s", mode, schedule, minutes, a.dags_rate)
        out["modes"][mode] = _measure(a, src, workdir, mode, schedule, minutes)
    ev, cron = out["modes"].get("event"), out["modes"].get("cron")
    if ev and cron:
        out["ratio_event_over_cron"] = {q: ratio(ev["freshness_s"][q], cron["freshness_s"][q])
                                        for q in ("p50", "p90", "p99", "max")}
    return out


class AppliedSampler:
    """The target's applied position of ``table`` at 10 Hz: (position, wall time) on each change."""

    def __init__(self, target, table: str):
        self.target, self.table = target, table
        self.samples: list[tuple[str, float]] = []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = None
        while not self.stop_ev.is_set():
            try:
                p = self.target.applied_pos("src", self.table)
            except Exception:  # noqa: BLE001 - a connection lost: reconnect on the next look
                try:
                    self.target.close()
                except Exception:  # noqa: BLE001
                    pass
                p = None
            if p is not None and p != last:
                self.samples.append((p.encode(), time.time()))
                last = p
            self.stop_ev.wait(0.1)

    def latest(self) -> str | None:
        return self.samples[-1][0] if self.samples else None

    def stop(self) -> None:
        self.stop_ev.set()
        if self.thread.is_alive():
            self.thread.join(5)


def _measure(a, src, workdir: Path, mode: str, schedule: str, minutes: float) -> dict:
    from airflow_provider_dblog.engine.targets.postgres import PostgresTarget

    table = f"dags_{mode}"
    q = src.qualified(table)
    src.create_table(table)
    src.seed(table, SEED_ROWS)
    env = Env(src, f"dags_{mode}", [table], workdir, target=True, spark=a.spark)
    raw = yaml.safe_load(env.path.read_text())
    raw["airflow"] = {"tail_run_seconds": a.dags_tail_run_seconds, "apply_schedule": schedule}
    env.path.write_text(yaml.safe_dump(raw))
    (env.dir / "dags").mkdir()
    (env.dir / "dags" / "dblog_dags.py").write_text(DAG_FILE.format(dags=str(DAGS), config=str(env.path)))
    (env.dir / "airflow").mkdir()
    airflow = RunningAirflow(env.dir / "airflow", env.dir / "dags")
    target = PostgresTarget(env.cfg.target())
    sampler = AppliedSampler(target, q)
    writer = Writer(src, table, a.dags_rate, SEED_ROWS + 1, SEED_ROWS, env.dir / "writes.json")
    try:
        t0 = time.monotonic()
        airflow.start()
        api = airflow.api
        api.set_paused(TAIL, False)
        wait_until(env.state.checkpoint, 300, "the tail DAG's first checkpoint", poll=0.2)
        sampler.thread.start()
        # warm-up: the first apply creates the target table (event: the watcher's first run)
        if mode == "event":
            api.set_paused(APPLY, False)
        else:
            api.wait_run(APPLY, api.trigger(APPLY), timeout=600)
        wait_until(sampler.latest, 600, "the first apply run", poll=0.2)
        started_s = round(time.monotonic() - t0, 1)
        writer.start()
        time.sleep(minutes * 60)
        writes = writer.finish()
        head = head_position(env)
        wait_until(lambda: (cp := env.state.checkpoint()) and cp.pos >= head, 300, "the tail read every write")
        last = env.state.checkpoint().pos.encode()
        wait_until(lambda: (p := sampler.latest()) and p >= last, 600, "the target applied every write", poll=0.2)
        runs = api.runs(APPLY)
    finally:
        sampler.stop()
        if writer.proc.is_alive():
            writer.proc.kill()
        airflow.stop()   # before the set-up's Redis keys and target go
        target.close()
    try:
        pos = positions_by_wseq(env.store, q)
    finally:
        env.close(a.keep)
    tl = Timeline(sampler.samples)
    vals = [tl.covered_at(pos[w]) - t if w in pos and tl.covered_at(pos[w]) else None for w, t, _l, _o in writes]
    done = [r for r in runs if r.get("start_date") and r.get("end_date")]
    return {"apply_schedule": schedule, "minutes": minutes, "writes": len(writes),
            "not_in_changelog": sum(w not in pos for w, *_ in writes), "freshness_s": summary(vals),
            "apply_runs": len(runs), "run_types": sorted({r["run_type"] for r in runs}),
            "run_seconds": summary([_seconds(r["start_date"], r["end_date"]) for r in done]),
            "airflow_start_s": started_s}


def _seconds(start: str, end: str) -> float:
    from datetime import datetime
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
