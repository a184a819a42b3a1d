"""Builds dblog's DAGs from the one YAML config.

For each source:  ``dblog_tail__<source>`` (continuous, bounded runs),
                  ``dblog_dump__<source>__<db>__<table>`` (one per table: a task group per
                  chunk by default, or one Spark application for the whole dump),
                  ``dblog_repair__<source>`` (the UI form: all, one table, keys, WHERE),
                  ``dblog_dump_control__<source>`` (pause, resume, cancel a request).
For each target:  ``dblog_apply__<target>`` (updates one Asset per table);
                  ``dblog_maintain__<target>`` for a lake target (Delta, Iceberg): compaction
                  and cleanup on ``maintain_schedule`` (default daily) and from a form.

Optional ``airflow:`` section of the config:
    airflow: {tail_run_seconds: 60, apply_schedule: event, spark_conn_id: spark_default,
              dump_dag: chunks, chunks_per_run: null, maintain_schedule: "@daily"}

``apply_schedule``: ``event`` (default) schedules the apply DAG on the Asset
``dblog-ready://<target>``, whose AssetWatcher (``ApplyReadyTrigger``, in the triggerer) adds
an event as soon as the tail's checkpoint passes the target's: a commit is applied within
seconds, and a change made while a run is active is applied by the one queued after it. A
cron expression or preset (e.g. ``"*/2 * * * *"``) applies on that schedule instead; null
only when triggered.

``dump_dag``: ``chunks`` (default) shows each chunk as a task group (select between the
watermarks, a deferrable HW sensor, reconcile), ``chunks_per_run`` groups per run, and the
run triggers the next one until the request is done; ``application`` runs the whole dump in
one Spark application (fastest on big tables: no Spark start per chunk; ``chunks_per_run``
then bounds the chunks of one run, default all).

``chunks_per_run`` null (default) with ``chunks``: 10 groups per run while the file has up to
100 captured tables (all sources together), fewer above that so that the file holds at most
about 1,000 static chunk groups (``CHUNK_GROUP_BUDGET``): 200 tables get 5 per run, 1,000 or
more get one (a dump DAG of 6 tasks; each run does one chunk and triggers the next). Every
DAG of the file is built on each parse, within Airflow's DAG-file import timeout (30 s by
default): 1,000 tables parse in about 3 s this way, in 11 s with 10 groups each. A number
sets the groups per run for every table whatever their count.
"""
from __future__ import annotations

import datetime as dt

import yaml
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, TaskGroup, task

from airflow_provider_dblog.assets import apply_ready_asset
from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.targets.base import MIN_RETENTION_HOURS
from airflow_provider_dblog.operators.apply import DBLogApplyOperator
from airflow_provider_dblog.operators.chunk import DBLogChunkDumpOperator
from airflow_provider_dblog.operators.dump import (DBLogCreateDumpOperator, DBLogDumpControlOperator,
                                                   DBLogDumpOperator)
from airflow_provider_dblog.operators.maintain import DBLogMaintainOperator
from airflow_provider_dblog.operators.reconcile import DBLogReconcileOperator
from airflow_provider_dblog.operators.tail import DBLogTailOperator
from airflow_provider_dblog.operators.verify import DBLogVerifyOperator, raise_if_differs
from airflow_provider_dblog.params import repair_params, verify_params
from airflow_provider_dblog.sensors.watermark import DBLogHighWatermarkSensor

START = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
DEFAULTS = {"tail_run_seconds": 60, "apply_schedule": "event", "spark_conn_id": "spark_default",
            "chunks_per_run": None, "dump_dag": "chunks", "maintain_schedule": "@daily",
            "verify_schedule": "@daily"}
LAKE_KINDS = ("delta", "iceberg")
EVENT = "event"
DUMP_DAGS = ("chunks", "application")
CHUNK_GROUPS = 10  # chunk task groups per run of a chunked dump DAG, unless chunks_per_run says
CHUNK_GROUP_BUDGET = 1_000  # chunks_per_run null: at most about this many static groups in the file
REQUEST = "{{ ti.xcom_pull(task_ids='create_request') }}"


def _options(path: str, raw: dict) -> dict:
    unknown = set(raw.get("airflow") or {}) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"{path}: unknown airflow option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    opts = DEFAULTS | (raw.get("airflow") or {})
    if opts["dump_dag"] not in DUMP_DAGS:
        raise ValueError(f"{path}: airflow.dump_dag must be one of {DUMP_DAGS}, not {opts['dump_dag']!r}")
    runs = opts["chunks_per_run"]
    if runs is not None and (not isinstance(runs, int) or isinstance(runs, bool) or runs < 1):
        raise ValueError(f"{path}: airflow.chunks_per_run must be a whole number >= 1 or null, not {runs!r}")
    _check_schedule(path, opts["apply_schedule"])
    _check_schedule(path, opts["maintain_schedule"], "maintain_schedule")
    _check_schedule(path, opts["verify_schedule"], "verify_schedule")
    return opts


def _check_schedule(path: str, schedule, name: str = "apply_schedule") -> None:
    """``apply_schedule`` must be ``event``, null, a cron expression or an Airflow preset
    (``maintain_schedule`` the same, without ``event``)."""
    from croniter import croniter
    presets = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
    event = name == "apply_schedule"
    if schedule is None or (event and schedule in (EVENT, "@continuous")) or (isinstance(schedule, str) and (
            schedule in presets or croniter.is_valid(schedule))):
        return
    raise ValueError(f"{path}: airflow.{name} must be "
                     + (f"{EVENT!r} (apply as soon as there is something to apply), " if event else "")
                     + f"a cron expression such as '*/2 * * * *', an Airflow preset "
                     f"({', '.join(presets)}) or null (only when triggered), not {schedule!r}")


def _apply_schedule(opts: dict, target: str, config_path: str):
    if opts["apply_schedule"] == EVENT:
        return [apply_ready_asset(target, config_path)]
    return opts["apply_schedule"]


def _tag(name: str) -> str:
    return name.replace(".", "__")


def chunk_groups(opts: dict, tables: int) -> int:
    """Chunk task groups per run of each chunked dump DAG of a file capturing ``tables``
    tables: ``chunks_per_run`` if set, else ``CHUNK_GROUPS`` within ``CHUNK_GROUP_BUDGET``."""
    if opts["chunks_per_run"] is not None:
        return opts["chunks_per_run"]
    return max(1, min(CHUNK_GROUPS, CHUNK_GROUP_BUDGET // max(1, tables)))


def build_dags(config_path: str) -> dict[str, DAG]:
    with open(config_path) as f:   # read once: the options from the text, the rest by load_config
        raw = yaml.safe_load(f) or {}
    opts = _options(config_path, raw)
    cfg = _load(config_path)
    groups = chunk_groups(opts, sum(len(s.tables) for s in cfg.sources.values()))
    dags: dict[str, DAG] = {}
    for source in cfg.sources.values():
        tags = ["dblog", f"source:{source.name}"]
        with DAG(f"dblog_tail__{source.name}", schedule="@continuous", start_date=START, catchup=False,
                 max_active_runs=1, tags=tags, description=f"Tails the change log of {source.name}",
                 doc_md=f"Tails the change log of **{source.name}**: each run reads for "
                        f"{opts['tail_run_seconds']} s, checkpoints and ends; the next run follows.") as d:
            DBLogTailOperator(task_id="tail", config_path=config_path, source=source.name,
                              max_seconds=opts["tail_run_seconds"])
        dags[d.dag_id] = d

        for table in source.tables:
            with DAG(f"dblog_dump__{source.name}__{_tag(table)}", schedule=None, start_date=START,
                     catchup=False, max_active_runs=1, tags=tags + [f"table:{table}"],
                     render_template_as_native_obj=True,
                     description=f"Full dump of {table} (source {source.name}) in watermark-bounded chunks",
                     params=_dump_params(cfg),
                     doc_md=f"Full dump of `{table}` in chunks, each between a low and a high watermark"
                            + (f" ({groups} per run; a run triggers the next while chunks remain). "
                               if opts["dump_dag"] == "chunks" else ". ")
                            + "Pause or cancel it with `dblog_dump_control__" + source.name + "`; trigger "
                            "this DAG again with the request id to resume.") as d:
                create = DBLogCreateDumpOperator(
                    task_id="create_request", config_path=config_path, source=source.name, scope="table",
                    table=table, chunk_size="{{ params.chunk_size }}", parallelism="{{ params.parallelism }}",
                    resume_request="{{ params.request_id }}")
                if opts["dump_dag"] == "chunks":
                    _chunk_groups(create, d.dag_id, config_path, source.name, opts, groups)
                else:
                    create >> DBLogDumpOperator(task_id="dump", config_path=config_path, source=source.name,
                                                request_id=REQUEST, max_chunks=opts["chunks_per_run"],
                                                conn_id=opts["spark_conn_id"])
            dags[d.dag_id] = d

        with DAG(f"dblog_repair__{source.name}", schedule=None, start_date=START, catchup=False,
                 tags=tags + ["repair"], render_template_as_native_obj=True,
                 description=f"Repair or backfill {source.name}: all tables, one table, keys or a condition",
                 params=repair_params(cfg, source.name),
                 doc_md="**Repair or backfill** from the UI: *Trigger DAG* opens a form. Choose the "
                        "scope (all tables, one table, primary keys, or a WHERE condition), the table, "
                        "and the keys or condition. Everything is validated before the source is "
                        "touched; the dump then runs on Spark and every target of this source is "
                        "applied.") as d:
            create = DBLogCreateDumpOperator(
                task_id="create_request", config_path=config_path, source=source.name, from_params=True)
            dump = DBLogDumpOperator(task_id="dump", config_path=config_path, source=source.name,
                                     request_id=REQUEST, conn_id=opts["spark_conn_id"])
            create >> dump
            for target in cfg.targets.values():
                if target.source == source.name:
                    dump >> DBLogApplyOperator(task_id=f"apply__{target.name}", config_path=config_path,
                                               target=target.name, conn_id=opts["spark_conn_id"])
        dags[d.dag_id] = d

        with DAG(f"dblog_dump_control__{source.name}", schedule=None, start_date=START, catchup=False,
                 tags=tags, render_template_as_native_obj=True,
                 description=f"Pause, resume or cancel a dump request of {source.name}",
                 params={"request_id": Param(type="string", minLength=1, title="Request id",
                                             description="Pick one of the newest requests that are not "
                                                         "finished (as of the DAG's last parse), or type an "
                                                         "id: the create_request task's XCom, or `dblog "
                                                         "status`.",
                                             **_request_choices(cfg, source.name)),
                         "action": Param("pause", enum=["pause", "resume", "cancel"], title="Action",
                                         description="pause: stop at the next chunk boundary; resume: "
                                                     "clear the pause (then run the dump again); cancel: "
                                                     "stop for good. A finished or unknown request is refused.")},
                 doc_md="Pause, resume or cancel a dump request. A paused dump stops at the next chunk "
                        "boundary; trigger its dump DAG with the request id to continue.") as d:
            DBLogDumpControlOperator(task_id="control", config_path=config_path, source=source.name,
                                     request_id="{{ params.request_id }}", action="{{ params.action }}")
        dags[d.dag_id] = d

        dags.update(_verify_dag(cfg, config_path, source.name, opts))

    for target in cfg.targets.values():
        with DAG(f"dblog_apply__{target.name}", schedule=_apply_schedule(opts, target.name, config_path),
                 start_date=START,
                 catchup=False, max_active_runs=1, tags=["dblog", f"target:{target.name}"],
                 description=f"Applies the log of {target.source} to {target.name}",
                 doc_md=f"Applies the event log of **{target.source}** to **{target.name}** up to the "
                        "frontier, then updates one Asset per table (`dblog://<source>/<db>/<table>`). "
                        + (f"Runs whenever `dblog-ready://{target.name}`'s watcher sees new work."
                           if opts["apply_schedule"] == EVENT else
                           f"Schedule: `{opts['apply_schedule']}`.")) as d:
            DBLogApplyOperator(task_id="apply", config_path=config_path, target=target.name,
                               conn_id=opts["spark_conn_id"])
        dags[d.dag_id] = d
        if target.kind in LAKE_KINDS:
            dags.update(_maintain_dag(config_path, target, opts))
    return dags


def _dump_params(cfg) -> dict[str, Param]:
    """The dump DAG's form: resume a request, or a new dump's chunk size and parallelism."""
    return {"request_id": Param(None, type=["null", "string"], title="Resume request",
                                description="Empty: a new full dump. A request id: "
                                            "resume it from its last completed chunk."),
            "chunk_size": Param(cfg.dump.chunk_size, type="integer", minimum=1, maximum=10_000_000,
                                title="Chunk size", description="Rows per chunk (one LW/HW window each)."),
            "parallelism": Param(cfg.dump.parallelism, type="integer", minimum=1, maximum=64,
                                 title="Read parallelism", description="Spark JDBC partitions per chunk.")}


def _verify_dag(cfg, config_path: str, source: str, opts: dict) -> dict[str, DAG]:
    """A task per target of the source: each compares its target with the source under writes."""
    targets = [t for t in cfg.targets.values() if t.source == source]
    if not targets:
        return {}
    with DAG(f"dblog_verify__{source}", schedule=opts["verify_schedule"], start_date=START, catchup=False,
             max_active_runs=1, tags=["dblog", f"source:{source}", "verify"], render_template_as_native_obj=True,
             description=f"Verifies every target of {source} against it (and repairs, if asked)",
             params=verify_params(cfg, source),
             doc_md=f"**Verify** each target of **{source}** while both keep changing: chunks read in "
                    "watermark windows, each target read once past them, keys the log changed meanwhile "
                    "left out (no false positives). For a target that differs, its `verify__<target>` task "
                    "logs the report and adds its Asset event, and its `equal__<target>` task fails; *Repair* dumps, applies and verifies again exactly the keys that differ. "
                    "Each task adds an event to `dblog-verify://<target>` with the counts per table.") as d:
        for target in targets:   # params['keys']: params.keys is the dict's method
            verify = DBLogVerifyOperator(
                task_id=f"verify__{target.name}", config_path=config_path, target=target.name,
                scope="{{ params.scope }}", table="{{ params.table }}", keys="{{ params['keys'] }}",
                where="{{ params.where }}", repair="{{ params.repair }}", conn_id=opts["spark_conn_id"],
                fail_on_difference=False)   # it succeeds (its Asset event is added); the next task judges
            verify >> task(task_id=f"equal__{target.name}")(raise_if_differs)(verify.output)
    return {d.dag_id: d}


def _maintain_dag(config_path: str, target, opts: dict) -> dict[str, DAG]:
    with DAG(f"dblog_maintain__{target.name}", schedule=opts["maintain_schedule"], start_date=START,
             catchup=False, max_active_runs=1, tags=["dblog", f"target:{target.name}", "maintenance"],
             description=f"Compacts and cleans up the {target.kind} tables of {target.name}",
             params={"tables": Param("", type="string", title="Tables",
                                     description="Comma-separated db.table names; empty: every table."),
                     "retention_hours": Param(168, type="integer", minimum=MIN_RETENTION_HOURS[target.kind],
                                              title="Retention (hours)",
                                              description="Time travel kept: older snapshots and unreferenced "
                                                          f"files go ({target.kind}: at least "
                                                          f"{MIN_RETENTION_HOURS[target.kind]} h)."),
                     "dry_run": Param(False, type="boolean", title="Dry run", description="Count only."),
                     "z_order": Param(False, type="boolean", title="Z-order (Delta)",
                                      description="Rewrite the table clustered by its key.")},
             doc_md=f"Maintenance of the **{target.kind}** target **{target.name}**: small files compacted "
                    "(sorted by key), snapshots and files older than the retention removed. Rows and the "
                    "applied position never change; readers and a running apply are not disturbed. The "
                    "task log and XCom give the file counts before and after.") as d:
        DBLogMaintainOperator(task_id="maintain", config_path=config_path, target=target.name,
                              tables="{{ params.tables }}", retention_hours="{{ params.retention_hours }}",
                              dry_run="{{ params.dry_run }}", z_order="{{ params.z_order }}")
    return {d.dag_id: d}


def _chunk_groups(create, dag_id: str, config_path: str, source: str, opts: dict, groups: int) -> None:
    """Algorithm 1 for one table, a task group per chunk, in order: ``select`` (open the
    window, LW, chunk select, HW), ``wait_hw`` (deferred to the triggerer until the tail has
    the HW), ``reconcile`` (drop keys changed in the window, snapshot at the HW). A chunk
    task finding no chunk left is skipped, and so is the rest. ``next_run`` triggers this DAG
    again with the request id while chunks remain (one run at a time: it queues). ``groups``:
    :func:`chunk_groups`."""
    previous = create
    for i in range(1, groups + 1):
        with TaskGroup(f"chunk_{i:02d}", tooltip=f"chunk {i} of this run: select, wait for the HW, reconcile") as group:
            select = DBLogChunkDumpOperator(task_id="select", config_path=config_path, source=source,
                                            request_id=REQUEST, spark_conn_id=opts["spark_conn_id"])
            hw = DBLogHighWatermarkSensor(task_id="wait_hw", config_path=config_path, source=source,
                                          window=select.output, deferrable=True)
            reconcile = DBLogReconcileOperator(task_id="reconcile", config_path=config_path, source=source,
                                               chunk=select.output)
            select >> hw >> reconcile
        previous >> group
        previous = group

    left = ShortCircuitOperator(task_id="chunks_left", python_callable=chunks_left, trigger_rule="none_failed",
                                op_kwargs={"config_path": config_path, "source": source, "request_id": REQUEST})
    previous >> left >> TriggerDagRunOperator(
        task_id="next_run", trigger_dag_id=dag_id, conf={"request_id": REQUEST},
        note="continues the dump request of conf.request_id")  # (note is not a template field)


def chunks_left(config_path: str, source: str, request_id: str) -> bool:
    """True while the request has chunks to do and is neither paused nor cancelled (one
    function for every dump DAG: a callable per DAG would be made on every parse)."""
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    runner = DBLogHook(config_path=config_path).runner(source)
    try:
        status = runner.state.request(request_id)["status"]
        if status in ("done", "paused", "cancelled") or runner.state.flag(request_id, "pause"):
            return False
        return not runner.request_done(request_id)
    finally:
        runner.source.close()


def _request_choices(cfg, source: str) -> dict:
    """The control form's proposals: the source's open dump requests, read from Redis when
    the DAG is parsed (a quick read with a short timeout; none when Redis is unreachable,
    and the field still takes a typed id)."""
    import redis

    from airflow_provider_dblog.engine.requests import controllable_requests
    from airflow_provider_dblog.engine.state import RedisState
    try:
        client = redis.Redis.from_url(cfg.redis_url, decode_responses=True, socket_timeout=1,
                                      socket_connect_timeout=1)
        try:
            choices = controllable_requests(RedisState(cfg.redis_url, cfg.state_prefix, source, client=client))
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return {}
    return {"examples": list(choices), "values_display": choices} if choices else {}


def _load(config_path: str):
    """The config's shape (names, tables, sizes) for building DAGs; connections named
    by ``conn_id`` are not looked up at parse time (tasks resolve them)."""
    import os
    return load_config(config_path, env=_ParseEnv(os.environ))


class _ParseEnv(dict):
    """At DAG-parse time a missing ``AIRFLOW_CONN_*`` is fine: only names and tables are needed."""

    def __init__(self, base):
        super().__init__(base)

    def get(self, key, default=None):
        if key.startswith("AIRFLOW_CONN_") and key not in self:
            return '{"host": "unresolved", "port": 1, "login": "unresolved"}'
        return super().get(key, default)
