"""The benchmark phases. Each builds its own Env (config, Redis prefix, storage) so
phases never see each other's state, and returns a plain dict for results.json."""
from __future__ import annotations

import cProfile
import dataclasses
import io
import logging
import pstats
import threading
import time
from pathlib import Path

import yaml

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.jobs import run_spark_job
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.tail import Tail
from airflow_provider_dblog.engine.wiring import Wiring

from .env import Env, TailProcess, head_position, run_bench_app
from .metrics import Timeline, positions_by_wseq, ratio, summary
from .workload import Writer

log = logging.getLogger("bench")


def _submit(env: Env, table: str, **spec) -> str:
    src = open_source(env.cfg.source())
    try:
        return Wiring(env.cfg, "src").runner(source=src).submit(
            DumpSpec("table", [table], **spec))
    finally:
        src.close()


def _dump_job(env: Env, rid: str, config: Path | None = None) -> dict:
    return run_spark_job(env.cfg, "dump_job", ["--config", str(config or env.path), "--source", "src",
                                               "--request", rid])


def _serial_config(env: Env) -> Path:
    """The env's config with ``dump.pipeline: false`` (each chunk selected after the one
    before it finished), for the same state and storage."""
    raw = yaml.safe_load(env.path.read_text())
    raw["dump"]["pipeline"] = False
    path = env.dir / "dblog-serial.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# -- 1. dump throughput ---------------------------------------------------------
def dump(a, src, workdir: Path) -> dict:
    q = src.qualified(a.table)
    env = Env(src, "dump", [a.table], workdir, dump={"chunk_size": a.chunk_size, "parallelism": a.parallelism},
              spark=a.spark)
    tail = None
    try:
        tail = TailProcess(env)  # windows close only when the tail has seen the HW
        log.info("dump: baseline raw JDBC read of %s (%d partitions)", q, a.parallelism)
        base = run_bench_app(env, "baseline_read", [
            "--config", str(env.path), "--table", q, "--key", "id", "--lower", "1", "--upper", str(a.rows),
            "--partitions", str(a.parallelism), "--out", "file://" + str(env.dir / "baseline.parquet")])
        log.info("dump: our dump_job of %s (chunk %d, parallelism %d)", q, a.chunk_size, a.parallelism)
        ours = _dump_job(env, _submit(env, q))
        windows = env.closed_windows()
        log.info("dump: our dump_job again, one chunk after the other (dump.pipeline false)")
        serial = _dump_job(env, _submit(env, q), _serial_config(env))
        prof = None
        if a.profile:
            log.info("dump: profiled run of %d chunk(s)", a.profile_chunks)
            prof = run_bench_app(env, "dump_profiled", ["--config", str(env.path), "--request",
                                                       _submit(env, q), "--max-chunks", str(a.profile_chunks)])
    finally:
        if tail:
            tail.stop()
        env.close(a.keep)
    n = a.rows
    rate = lambda s: round(n / s, 1) if s else None  # noqa: E731
    base_start = base["submit_seconds"] - base["work_s"]
    ours_start = ours["submit_seconds"] - ours["seconds"]
    # the engine's per-chunk "finish_s" runs from the start of finish_chunk to its end:
    # waiting for the HW in the log, plus reading the window's events, reconcile and snapshot
    waits = [w.get("finish_s", 0) for w in windows]
    return {
        "rows": n, "rows_dumped": ours["rows"], "chunks": ours["chunks"], "dropped": ours["dropped"],
        "chunk_size": a.chunk_size, "parallelism": a.parallelism,
        "baseline": {"seconds": base["submit_seconds"], "work_s": base["work_s"], "rows": base["rows"],
                     "rows_per_s": rate(base["submit_seconds"]), "rows_per_s_excl_start": rate(base["work_s"]),
                     "overhead_s": round(base_start, 3)},
        "ours": {"seconds": ours["submit_seconds"], "work_s": ours["seconds"],
                 "rows_per_s": rate(ours["submit_seconds"]), "rows_per_s_excl_start": rate(ours["seconds"]),
                 "overhead_s": round(ours_start, 3), "finish_chunk_s_total": round(sum(waits), 3),
                 "finish_chunk_s_max": max(waits, default=0)},
        "ours_serial": {"seconds": serial["submit_seconds"], "work_s": serial["seconds"],
                        "rows_per_s_excl_start": rate(serial["seconds"])},
        "ratio": ratio(base["submit_seconds"], ours["submit_seconds"]),
        "ratio_excl_start": ratio(base["work_s"], ours["seconds"]),
        "ratio_pipelined_vs_serial": ratio(serial["seconds"], ours["seconds"]),
        "goal": 0.7, "profile": prof,
    }


# -- 2. tail throughput ---------------------------------------------------------
def _tail_once(env: Env, start: Position, resume: dict, n: int, profiler=None, **source):
    """Our Tail over the pre-written range: checkpoint set to its start, run until n events.
    ``source``: settings of the source config to change (``decoder``)."""
    token = env.state.acquire_lease("bench-seed", 30)
    env.state.commit(token, start, resume, [], 0)
    env.state.release_lease(token)
    tail = Tail(open_source(dataclasses.replace(env.cfg.source(), **source)), env.state, env.store,
                env.cfg.tail, owner="bench", dump=env.cfg.dump)
    if profiler:
        profiler.enable()
    stats = tail.run(max_events=n)
    if profiler:
        profiler.disable()
    tail.source.close()
    return stats


def _prepare_log(env: Env) -> None:
    """What Tail.run does first (source.prepare_log), done before the writes: a log
    that needs set-up (a PostgreSQL replication slot) then retains them. MySQL: nothing."""
    s = open_source(env.cfg.source())
    try:
        s.prepare_log()
    finally:
        s.close()


def tail(a, src, workdir: Path) -> dict:
    table = "tail_events"
    src.create_table(table)
    env = Env(src, "tail", [table], workdir)
    prof_env = Env(src, "tailprof", [table], workdir) if a.profile else None
    # MySQL: our Tail again with the library decoder (context: what the compiled one gains)
    lib_env = Env(src, "taillib", [table], workdir) if src.kind == "mysql" else None
    try:
        for e in (env, prof_env, lib_env):
            if e:
                _prepare_log(e)
        log.info("tail: writing %d row changes in transactions of %d rows", a.tail_events, a.txn_rows)
        start, resume = src.write_events(table, a.tail_events, a.txn_rows)
        end = src.log_end()  # the log's head after the writes: the C decoder's stop
        log.info("tail: bare decode loop")
        bare = src.bare_read(resume, a.tail_events, [table], env.wm)
        log.info("tail: the C decoder shipped with the database, %s .. %s", resume, end)
        phys = src.physical_read(resume, end, a.tail_events, [table], env.wm)
        log.info("tail: our Tail")
        stats = _tail_once(env, start, resume, a.tail_events)
        ours = {"events": stats.events, "seconds": round(stats.seconds, 3), "flushes": stats.flushes,
                "events_per_s": round(stats.events / stats.seconds, 1), "decoder": env.cfg.source().decoder}
        library = None
        if lib_env:
            log.info("tail: our Tail with decoder mysql-replication")
            lstats = _tail_once(lib_env, start, resume, a.tail_events, decoder="mysql-replication")
            library = {"events": lstats.events, "seconds": round(lstats.seconds, 3),
                       "events_per_s": round(lstats.events / lstats.seconds, 1), "decoder": "mysql-replication"}
        prof = None
        if prof_env:
            log.info("tail: cProfile of Tail.run")
            p = cProfile.Profile()
            pstats_ = _tail_once(prof_env, start, resume, a.tail_events, p)
            prof = {"seconds_under_profiler": round(pstats_.seconds, 3), "by_file": by_file(p),
                    "tottime": _top(p, "tottime"), "cumulative": _top(p, "cumulative")}
    finally:
        env.close(a.keep)
        for e in (prof_env, lib_env):
            if e:
                e.close(a.keep)
    return {"events": a.tail_events, "txn_rows": a.txn_rows, "baseline": bare, "ours": ours,
            "ratio": ratio(ours["events_per_s"], bare["events_per_s"]), "goal": 0.8,
            # the physical limit (issue 30): no goal, the distance to it is the figure
            "physical": phys, "ratio_physical": ratio(ours["events_per_s"], phys["events_per_s"]),
            "goal_physical": 0.25, "ours_library_decoder": library,
            "profile": prof}


def by_file(p: cProfile.Profile, n: int = 15) -> dict[str, float]:
    """Own time summed per source file: which layer (the binlog library, the engine's
    conversion, Arrow/Parquet, Redis) the tail's time goes to."""
    acc: dict[str, float] = {}
    for (file, _line, _fn), (_cc, _nc, tt, _ct, _callers) in pstats.Stats(p).stats.items():
        parts = Path(file).parts
        key = "/".join(parts[-2:]) if len(parts) > 1 else "(built-in functions)" if file == "~" else file
        acc[key] = acc.get(key, 0.0) + tt
    return {k: round(v, 3) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:n]}


def _top(p: cProfile.Profile, key: str, n: int = 20) -> list[str]:
    s = io.StringIO()
    pstats.Stats(p, stream=s).strip_dirs().sort_stats(key).print_stats(n)
    return [ln for ln in s.getvalue().splitlines() if ln.strip()][-n - 1:]


# -- 3 + 4. log lag and source impact, without and during a dump --------------------
def lag(a, src, workdir: Path) -> dict:
    """Lag of a write = when the tail's checkpoint passed the write's event (its commit
    to Redis happens only after the segment is durable) minus when the writer saw the
    statement return. Both are wall clocks of this machine, so no clock skew."""
    q = src.qualified(a.table)
    env = Env(src, "lag", [a.table], workdir, dump={"chunk_size": a.chunk_size, "parallelism": a.parallelism},
              spark=a.spark)
    tail = None
    writer = Writer(src, a.table, a.write_rate, a.rows + 1_000_000, a.rows, env.dir / "writes.json")
    try:
        tail = TailProcess(env)
        writer.start()
        t_base = time.time() + 2  # skip the writer's first connection and warm-up
        time.sleep(2 + a.baseline_seconds)
        t_dump0 = time.time()
        log.info("lag: dump of %s during writes at %.0f/s", q, a.write_rate)
        res = _dump_job(env, _submit(env, q))
        t_dump1 = time.time()
        time.sleep(3)
        writes = writer.finish()
        tail.drain(head_position(env))
        samples, windows = env.samples(), env.closed_windows()
    except BaseException:
        if tail:
            tail.stop()  # before its Redis keys go
            tail = None
        env.close(a.keep)
        raise
    finally:
        if tail:
            tail.stop()
        if writer.proc.is_alive():
            writer.proc.kill()
    try:
        pos = positions_by_wseq(env.store, q)
    finally:
        env.close(a.keep)
    cp = Timeline(samples)
    wins = []
    for w in windows:
        lw_t, hw_t = cp.covered_at(w["lw"]), cp.covered_at(w["hw"])
        wins.append({"lw": w["lw"], "hw": w["hw"], "lw_t": lw_t, "hw_t": hw_t, "closed_t": w["at"],
                     "rows": w.get("rows"), "hw_wait_s": w.get("hw_wait_s"), "finish_s": w.get("finish_s")})
    # "during the dump": from the first LW to the last window's close (the chunk selects);
    # the dump job's JVM start before it loads nothing
    d0 = min((w["lw_t"] for w in wins if w["lw_t"]), default=t_dump0)
    d1 = max((w["closed_t"] for w in wins), default=t_dump1)
    series, missing = [], 0
    for wseq, t, lat, op in writes:
        p = pos.get(wseq)
        durable = cp.covered_at(p) if p else None
        missing += p is None
        phase = ("no_dump" if t_base <= t < t_dump0 else "dump" if d0 <= t <= d1
                 else "dump_start" if t_dump0 <= t < d0 else "other")
        series.append({"wseq": wseq, "t": t, "write_s": lat, "lag_s": durable - t if durable else None,
                       "phase": phase, "op": op})
    by = lambda ph, k: [s[k] for s in series if s["phase"] == ph]  # noqa: E731
    lag_b, lag_d = summary(by("no_dump", "lag_s")), summary(by("dump", "lag_s"))
    w_b, w_d = summary(by("no_dump", "write_s")), summary(by("dump", "write_s"))
    return {
        "write_rate": a.write_rate, "writes": len(writes), "writes_not_in_changelog": missing,
        "baseline_seconds": a.baseline_seconds, "t_base": t_base, "t_dump_submit": t_dump0, "t_dump_end": t_dump1,
        "dump_interval": [d0, d1], "dump_seconds": res.get("submit_seconds"), "dump_rows": res.get("rows"),
        "windows": wins, "tail_flush_seconds": env.cfg.tail.flush_seconds,
        "lag": {"no_dump": lag_b, "dump": lag_d, "ratio_p99": ratio(lag_d["p99"], lag_b["p99"]),
                "ratio_p50": ratio(lag_d["p50"], lag_b["p50"]), "goal": 2.0,
                "dump_start": summary(by("dump_start", "lag_s"))},
        "impact": {"no_dump": w_b, "dump": w_d, "ratio_p99": ratio(w_d["p99"], w_b["p99"]),
                   "ratio_p50": ratio(w_d["p50"], w_b["p50"]), "goal": 1.3,
                   # spark-submit's JVM and session start before the first LW: no source
                   # load, but CPU taken from the database on a small machine
                   "dump_start": summary(by("dump_start", "write_s"))},
        "series": series,
    }


# -- 5. end-to-end freshness through the engine's apply job ----------------------------
def fresh(a, src, workdir: Path) -> dict:
    """Freshness of a write = first time the target's applied position (moved by the
    apply job in the same transaction as the merge) passed the write's event, minus
    the write's commit. Apply runs back to back, as a scheduler with no gap would."""
    table = "fresh_rows"
    q = src.qualified(table)
    src.create_table(table)
    src.seed(table, a.fresh_rows)
    env = Env(src, "fresh", [table], workdir, target=True, spark=a.spark)
    tail = None
    writer = Writer(src, table, a.write_rate, a.fresh_rows + 1, a.fresh_rows, env.dir / "writes.json")
    from airflow_provider_dblog.engine.targets.postgres import PostgresTarget
    target = PostgresTarget(env.cfg.target())
    applied: list[tuple[str, float]] = []
    stop = threading.Event()

    def poll():  # 10 Hz is fine against apply cycles of many seconds
        last = None
        while not stop.is_set():
            try:
                p = target.applied_pos("src", q)
            except Exception:  # noqa: BLE001 - the state table may not exist yet
                p = None
            if p is not None and p != last:
                applied.append((p.encode(), time.time()))
                last = p
            stop.wait(0.1)
    poller = threading.Thread(target=poll, daemon=True)
    runs = []
    if a.fresh_via == "airflow":
        # the provider's apply DAG (airflow dags test, SQLite metadata), run back to back;
        # the tail stays the `dblog tail` process (the tail DAG runs the same Tail.run)
        from airflow_provider_dblog.devenv.airflow_local import LocalAirflow
        af = LocalAirflow(str(env.path), f"bench-airflow-{src.run_id}")

        def apply_once() -> dict:
            t = time.monotonic()
            ok, out = af.dag_test("dblog_apply__tgt")
            if not ok:
                raise RuntimeError(f"dblog_apply__tgt failed:\n{out[-3000:]}")
            return {"submit_seconds": round(time.monotonic() - t, 3)}
    else:
        def apply_once() -> dict:  # what `dblog apply` does: in-process or on Spark by batch size
            return run_apply(env.cfg, "tgt", via=a.apply_via)
    try:
        tail = TailProcess(env)
        writer.start()
        poller.start()
        time.sleep(2)
        for i in range(a.apply_runs):
            t0 = time.time()
            r = apply_once()
            end = time.time()
            runs.append({"start": t0, "end": end, "seconds": round(end - t0, 3),
                         "spark_start_s": r.get("spark_start_s"), "events": r.get("events"),
                         "via": r.get("via"), "table": r.get("tables", {}).get(q)})
            log.info("fresh: apply run %d: %s events in %.1fs", i + 1, r.get("events"), time.time() - t0)
            # a scheduled apply: the next run starts --apply-interval after this one started
            time.sleep(max(0.0, t0 + a.apply_interval - time.time()))
        writes = writer.finish()
        time.sleep(0.3)
    except BaseException:
        if tail:
            tail.stop()  # before its Redis keys go
            tail = None
        env.close(a.keep)
        raise
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(5)
        if tail:
            tail.stop()
        if writer.proc.is_alive():
            writer.proc.kill()
        target.close()
        if a.fresh_via == "airflow" and not a.keep:
            import shutil
            shutil.rmtree(af.env["AIRFLOW_HOME"], ignore_errors=True)
    try:
        pos = positions_by_wseq(env.store, q)
    finally:
        env.close(a.keep)
    tl = Timeline(applied)
    # writes committed from the first apply's start to the one before the last's: the tail
    # had a whole interval to flush each of them before the last run, which must cover it
    lo, hi = runs[0]["start"], runs[max(1, len(runs) - 2)]["start"]
    vals = []
    for wseq, t, _lat, _op in writes:
        if lo <= t < hi and wseq in pos:
            at = tl.covered_at(pos[wseq])
            vals.append(at - t if at else None)
    return {"apply_runs": runs, "writes_measured": len(vals), "not_applied": sum(v is None for v in vals),
            "freshness_s": summary(vals),
            "via": ("the dblog_apply__tgt DAG (airflow dags test)" if a.fresh_via == "airflow"
                    else f"dblog apply --via {a.apply_via}")
                   + (f", one run every {a.apply_interval:g} s" if a.apply_interval else ", back to back"),
            # a write waits for the next run (on average half the interval), then that run
            "note": "freshness ~ tail flush + wait for the next apply run + the run itself; the "
                    "shipped DAGs in a running Airflow (event-driven or on a cron apply_schedule): phase dags"}
