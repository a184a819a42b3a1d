"""The ``dblog`` command: every engine step, outside Airflow, from the YAML config."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time

from .engine.config import Config, load_config
from .engine.requests import ACTIONS, DumpSpec, control_request, parse_spec, runnable_request, validate_spec
from .engine.errors import DBLogError
from .engine.quarantine import quarantined
from .engine.request_lease import wait_until_free
from .engine.sources import open_source
from .engine.tail import Tail
from .engine.wiring import Wiring

EXIT_SKIPPED = 3  # `dblog tail` did nothing: another tail holds the lease (2: an error)

log = logging.getLogger("dblog")


def _parts(cfg: Config, source_name: str | None):
    parts = Wiring(cfg, source_name)
    return parts.source_config, parts.state, parts.store


def cmd_check(cfg: Config, args) -> int:
    source = open_source(cfg.source(args.source))
    problems = source.check(scan_values=not args.no_value_scan)
    if not problems:
        print(f"source {source.name}: ready for CDC ({len(source.tables)} tables)")
    else:
        print(f"source {source.name}: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
    spark_ok = check_spark(cfg) is not None if args.spark else True
    return 0 if not problems and spark_ok else 1


def check_spark(cfg: Config) -> dict | None:
    """``dblog check --spark``: a tiny job on the configured master (spark_jobs/probe_job.py),
    and what it says about where the jobs run. The probe's result when all is well, else None."""
    from .engine.jobs import SparkJobError, run_spark_job
    print(f"spark: submitting a probe to {cfg.spark.master} ...")
    try:
        r = run_spark_job(cfg, "probe_job", ["--config", cfg.path], timeout_s=600,
                          echo=lambda line: None)
    except SparkJobError as e:
        print(f"  - the probe failed: {e}")
        return None
    where = "local mode, in the submitting process" if r["local_mode"] else (
        f"{len(r['executors'])} executor(s): {', '.join(r['executors']) or 'none'}")
    print(f"spark: application {r['app_id']} on {r['master']} ({r['deploy_mode']} mode), {where}")
    for py in r["executor_python"]:
        print(f"  executors' Python on {py['host']}: {py['python']} ({py['version']})")
    shared = r["storage_shared"]
    print(f"  storage root {r['storage_root']}: {'seen alike by the executors and the driver' if shared else 'NOT shared: executors write where the driver cannot read; use a shared path or a Hadoop-compatible URI'}")
    ok = shared and (r["local_mode"] or bool(r["executors"]))
    if not r["local_mode"] and not r["executors"]:
        print("  - no executor ran the probe's tasks")
    return r if ok else None


def cmd_tail(cfg: Config, args) -> int:
    src_cfg, state, store = _parts(cfg, args.source)
    source = open_source(src_cfg)
    source.check_or_raise(captured=store.captured_tables(source.tables))
    tail = Tail(source, state, store, cfg.tail, dump=cfg.dump)
    stopping = {"now": False}

    def on_term(signum, frame):  # finish the transaction in hand, flush, checkpoint, exit
        stopping["now"] = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    stats = tail.run(max_seconds=args.seconds, max_events=args.events, should_stop=lambda: stopping["now"],
                     wait_lease=args.wait_lease)
    out = {k: v for k, v in vars(stats).items() if k != "per_table"} | {"per_table": dict(stats.per_table)}
    print(json.dumps(out))
    for new in stats.dump_requests:
        print(f"dblog tail: {new['table']} is new to the capture; the rows it holds come with dump request "
              f"{new['request_id']}: run `dblog dump --request {new['request_id']}`", file=sys.stderr)
    if stats.skipped and not args.skip_ok:
        expires = ("its lease has just ended: run again" if stats.lease_expires_in_s is None
                   else f"its lease expires in {stats.lease_expires_in_s:.1f}s unless it renews it")
        print(f"dblog tail: another tail ({stats.lease_holder}) holds the lease; {expires}. "
              "--wait-lease SECONDS waits for it; --skip-ok exits 0 when skipped.", file=sys.stderr)
        return EXIT_SKIPPED
    return 0


def _spec_from_args(args) -> DumpSpec:
    if not args.all and not args.table:
        raise DBLogError("name --all, or --table (with --keys/--keys-file for a key list, --where for a condition)")
    keys = open(args.keys_file).read() if args.keys_file else args.keys
    scope = "all" if args.all else "keys" if keys is not None else "where" if args.where else "table"
    return parse_spec(scope, args.table, keys, args.where, args.chunk_size, args.parallelism)


def cmd_dump(cfg: Config, args) -> int:
    from .engine.jobs import run_spark_job
    src_cfg, state, store = _parts(cfg, args.source)
    if args.request:
        rid = args.request
        runnable_request(state, rid)
        # before a Spark start-up: wait for a dead runner's lease to lapse, refuse a live one
        ttl = cfg.dump.lease_seconds
        wait_until_free(state, rid, ttl, ttl if args.wait_lease is None else args.wait_lease)
        if state.flag(rid, "pause"):
            control_request(state, rid, "resume")
    else:
        source = open_source(src_cfg)
        spec = validate_spec(source, _spec_from_args(args), cfg.dump)  # before anything is written
        rid = state.create_request(spec.to_dict())
        print(f"dump request {rid}: {spec.scope} {', '.join(spec.tables)}")
    job_args = ["--config", cfg.path, "--source", src_cfg.name, "--request", rid]
    if args.max_chunks:
        job_args += ["--max-chunks", str(args.max_chunks)]
    if args.wait_lease is not None:
        job_args += ["--wait-lease", str(args.wait_lease)]
    result = run_spark_job(cfg, "dump_job", job_args)
    print(json.dumps(result, indent=2, default=str))
    return 0


def cmd_reset(cfg: Config, args) -> int:
    """The way back from lost state or a log gap (engine/recovery.py)."""
    from .engine.recovery import reset_source
    out = reset_source(cfg, args.source, args.confirm or "", drop_targets=args.drop_targets, dump=not args.no_dump)
    print(json.dumps(out, indent=2, default=str))
    if out["dump_request"]:
        print(f"next: run the tail, then `dblog dump --request {out['dump_request']}`, then the apply",
              file=sys.stderr)
    return 0


def cmd_control(cfg: Config, args) -> int:
    _, state, _ = _parts(cfg, args.source)
    out = control_request(state, args.request, args.action)
    print(f"request {args.request} ({out['status']}): {args.action} "
          f"(flags: pause {'on' if out['pause'] else 'off'}, cancel {'on' if out['cancel'] else 'off'})")
    return 0


def cmd_apply(cfg: Config, args) -> int:
    """In-process up to ``apply.local_max_events`` events (engine/apply.py), else on Spark."""
    from .engine.apply import run_apply
    result = run_apply(cfg, args.target, args.tables, via=getattr(args, "via", "auto") or "auto")
    print(json.dumps(result, indent=2, default=str))
    return 0


def cmd_verify(cfg: Config, args) -> int:
    """Compare a target with its source under writes (engine/verify_run.py): the report as
    JSON; exit 1 when a table differs (and --repair did not make it equal)."""
    from .engine.jobs import run_spark_job
    from .engine.verify_run import run_verify
    tcfg = cfg.target(args.target)
    spec = _spec_from_args(args)
    via = args.via if args.via != "auto" else "local" if spec.by_keys else "spark"
    out = run_verify(cfg, tcfg.name, spec, repair=args.repair, via=via, wait_s=args.wait,
                     run_spark=lambda rid: run_spark_job(cfg, "dump_job", ["--config", cfg.path, "--source",
                                                                           tcfg.source, "--request", rid]))
    print(json.dumps(out, indent=2, default=str))
    return 0 if out["equal"] or out.get("repaired") else 1


def cmd_maintain(cfg: Config, args) -> int:
    """Compaction and vacuum of a lake target's tables (engine/maintain.py), one JSON line
    per table with its file counts before and after. A PostgreSQL target: nothing to do."""
    from .engine.maintain import run_maintain
    try:
        out = run_maintain(cfg, args.target, args.table, retention_hours=args.retention_hours,
                           dry_run=args.dry_run, z_order=args.z_order)
    except ValueError as e:   # an unknown table, a retention shorter than the table allows
        print(f"dblog: error: {e}", file=sys.stderr)
        return 2
    head = {"target": out["target"], "kind": out["kind"]}
    if not out["tables"]:
        print(json.dumps(head | {k: v for k, v in out.items() if k in ("status", "why")}))
    for report in out["tables"].values():
        print(json.dumps(head | report))
    return 0


def status(cfg: Config, source_name: str | None = None) -> dict:
    src_cfg, state, store = _parts(cfg, source_name)
    cp = state.checkpoint()
    out: dict = {"source": src_cfg.name, "checkpoint": cp.pos.encode() if cp else None,
                 "checkpoint_age_s": round(time.time() - cp.updated_at, 3) if cp else None,
                 "frontier": None, "open_windows": [], "counters": state.counters(), "requests": []}
    front = state.frontier()
    out["frontier"] = front.encode() if front else None
    # a window with no runner holding its request is closed by the tail after dump.abandon_after
    out["open_windows"] = [{"id": w.id, "table": w.table, "request": w.request,
                            "age_s": round(time.time() - w.opened_at, 1),
                            "runner": state.lease_holder(w.request)} for w in state.open_windows()]
    out["abandon_after_s"] = cfg.dump.abandon_after
    out["windows_abandoned"] = [w for w in state.closed_windows(200) if w.get("outcome") == "abandoned"][:10]
    try:
        source = open_source(src_cfg)
        head, _ = source.current_resume()
        out["log_head"] = head.encode()
        out["behind_log_head"] = bool(cp and cp.pos < head)
        source.close()
    except Exception as e:  # status must work while the source is down
        out["log_head_error"] = str(e)
    # the tables whose schema change their targets cannot follow: they stop before it (engine/quarantine.py)
    out["quarantined"] = quarantined(state)
    # per target, the tables whose apply stops before a value no target can hold (apply_hold.held_at)
    out["held"] = {}
    for tcfg in cfg.targets.values():
        if tcfg.source != src_cfg.name:
            continue
        try:
            from .engine.apply_plan import held_tables
            from .engine.targets import open_target
            with open_target(tcfg) as target:
                held = held_tables(target, store, state, src_cfg.name, list(src_cfg.tables))
            if held:
                out["held"][tcfg.name] = held
        except Exception as e:  # status must work while a target is down
            out["held"][tcfg.name] = {"error": f"{type(e).__name__}: {e}"}
    # per table, the newest full dump's orphan sweep and which targets ran it (engine/sweep.py)
    out["orphan_sweeps"] = {t: {**sw, "done_by": state.sweeps_done(t)}
                            for t in src_cfg.tables if (sw := state.sweep(t)) is not None}
    # per table and target, the last verification (engine/verify_run.py)
    from .engine.verify_run import last_verifications
    out["verifications"] = last_verifications(state)
    for rid in state.requests(10):
        req = state.request(rid)
        out["requests"].append({"id": rid, "status": req["status"], "error": req.get("error", ""),
                                "runner": state.lease_holder(rid), "verify": req["spec"].get("verify"),
                                "scope": req["spec"]["scope"], "tables": {
                                    t: state.progress(rid, t) for t in req["spec"]["tables"]}})
    return out


def cmd_status(cfg: Config, args) -> int:
    print(json.dumps(status(cfg, args.source), indent=2, default=str))
    return 0


def cmd_demo(cfg: Config, args) -> int:
    from .devenv.demo import run_demo
    return run_demo(cfg, rows=args.rows, writers=args.writers, via=args.via,
                    sources=[args.source] if args.source else None, target_kind=args.target_kind)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dblog", description="DBLog watermark CDC: tail, dump, apply.")
    p.add_argument("--config", help="the YAML config file (required)")
    p.add_argument("--source", help="source name (default: the only one)")
    p.add_argument("-v", "--verbose", action="store_true")
    # the same options after the command too (dblog demo --config x.yaml); SUPPRESS keeps
    # a value given before the command when they are not repeated after it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="the YAML config file")
    common.add_argument("--source", default=argparse.SUPPRESS, help="source name")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)
    _add = sub.add_parser
    sub.add_parser = lambda *a, **kw: _add(*a, parents=[common], **kw)
    c = sub.add_parser("check", help="check the source's CDC set-up, and scan each table once for "
                                     "values no target can hold exactly")
    c.add_argument("--no-value-scan", action="store_true",
                   help="skip the scan of every table's values (one full read per table)")
    c.add_argument("--spark", action="store_true",
                   help="also submit a tiny job to the configured Spark master and report where it "
                        "ran, the executors' Python, and whether the storage root is shared")
    c.set_defaults(func=cmd_check)
    t = sub.add_parser("tail", help="tail the change log for a bounded time or number of events")
    t.add_argument("--seconds", type=float)
    t.add_argument("--events", type=int)
    t.add_argument("--wait-lease", type=float, default=0.0, metavar="SECONDS",
                   help="when another tail holds the lease, wait up to this long for it to end or expire")
    t.add_argument("--skip-ok", action="store_true",
                   help=f"exit 0 when another tail holds the lease (default: exit {EXIT_SKIPPED})")
    t.set_defaults(func=cmd_tail)
    d = sub.add_parser("dump", help="dump all tables, one table, or a list of keys (runs on Spark)")
    g = d.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true", help="every configured table")
    g.add_argument("--table", help="one table, as db.table")
    g.add_argument("--request", help="resume this request from its last completed chunk")
    d.add_argument("--keys", help='the keys: a JSON list, [1,2] or [[1,"a"],[2,"b"]] for composite keys, '
                                  'or one key per line (a composite key comma-separated)')
    d.add_argument("--keys-file", help="a file holding that JSON list")
    d.add_argument("--where", help="a plain condition on the table's columns, e.g. \"status = 'new' AND total > 10\"")
    d.add_argument("--chunk-size", type=int)
    d.add_argument("--parallelism", type=int)
    d.add_argument("--max-chunks", type=int, help="stop (paused) after this many chunks")
    d.add_argument("--wait-lease", type=float, default=None, metavar="SECONDS",
                   help="with --request: another runner runs it; wait up to this long for it to end or "
                        "expire, then refuse, naming it and when its lease expires (default: "
                        "dump.lease_seconds, enough for a dead runner's lease to lapse)")
    d.set_defaults(func=cmd_dump)
    for action in ACTIONS:
        f = sub.add_parser(action, help=f"{action} a dump request")
        f.add_argument("request")
        f.set_defaults(func=cmd_control, action=action)
    v = sub.add_parser("verify", help="compare a target with its source while both change (exit 1: it differs)")
    g = v.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true", help="every configured table (the default: name --all or --table)")
    g.add_argument("--table", help="one table, as db.table")
    v.add_argument("--target", help="the target to compare (default: the only one)")
    v.add_argument("--keys", help="only these keys (the syntaxes of dump --keys)")
    v.add_argument("--keys-file", help="a file holding that list")
    v.add_argument("--where", help="only the rows this condition selects now (as dump --where)")
    v.add_argument("--chunk-size", type=int)
    v.add_argument("--parallelism", type=int)
    v.add_argument("--repair", action="store_true",
                   help="dump, apply and verify again exactly the keys that differ")
    v.add_argument("--via", choices=("auto", "local", "spark"), default="auto",
                   help="where the chunks are read: auto (default) = in-process for keys/--where, else Spark")
    v.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for the target's apply to pass the chunks' HW (default 600)")
    v.set_defaults(func=cmd_verify)
    a = sub.add_parser("apply", help="apply the event log to a target (in-process when small, else on Spark)")
    a.add_argument("--target")
    a.add_argument("--tables", help="comma-separated db.table list (default: all)")
    a.add_argument("--via", choices=("auto", "local", "spark"), default="auto",
                   help="auto (default): in-process up to apply.local_max_events events, else Spark")
    a.set_defaults(func=cmd_apply)
    mt = sub.add_parser("maintain", help="compact and vacuum a lake target's tables (file counts as JSON lines)")
    mt.add_argument("--target", help="the target (default: the only one)")
    mt.add_argument("--table", help="comma-separated db.table list (default: every table of the target)")
    mt.add_argument("--retention-hours", type=int, default=168,
                    help="vacuum files unreferenced for this long (default 168: a week of time travel; "
                         "less than the table's delta.deletedFileRetentionDuration is refused)")
    mt.add_argument("--z-order", action="store_true", help="rewrite the table clustered by its key (all files)")
    mt.add_argument("--dry-run", action="store_true", help="count only: no compaction, list what vacuum would remove")
    mt.set_defaults(func=cmd_maintain)
    sub.add_parser("status", help="positions, lag, windows, dump progress").set_defaults(func=cmd_status)
    r = sub.add_parser("reset", help="after lost Redis state or a purged log: capture again from the log head "
                                     "and re-dump every table")
    r.add_argument("--confirm", metavar="SOURCE", help="the source's name again: the reset forgets its state")
    r.add_argument("--drop-targets", action="store_true",
                   help="also drop the targets' tables of the source (needed when the log's positions went back)")
    r.add_argument("--no-dump", action="store_true", help="do not request the full dump")
    r.set_defaults(func=cmd_reset)
    m = sub.add_parser("demo", help="seed, write concurrently, tail + dump + apply, verify")
    m.add_argument("--rows", type=int, default=1_000_000, help="rows to seed in all")
    m.add_argument("--writers", type=int, default=2)
    m.add_argument("--via", choices=("airflow", "engine"), default="airflow",
                   help="run the flow through the Airflow DAGs (default) or the dblog command")
    m.add_argument("--target-kind", choices=("postgres", "delta", "iceberg"), default="postgres",
                   help="apply into the source's target of this kind (the demo config has one of each)")
    m.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("the following arguments are required: --config")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        return args.func(cfg, args)
    except DBLogError as e:
        print(f"dblog: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
