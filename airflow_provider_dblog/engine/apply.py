"""One apply run of a target: :func:`run_apply`, the only entry point (the ``dblog apply``
command, DBLogApplyOperator, the demo and the bench all call it).

A run applies, table by table, the events between the target's checkpoint and the
frontier (engine/apply_plan.py plans each table's batch, engine/apply_batch.py stages and
merges it). It runs in this process when its events fit ``apply.local_max_events``
(:func:`choose_via`), else on Spark through the caller's ``run_spark`` (by default
``spark-submit`` of ``spark_jobs/apply_job.py``; the Airflow operator passes its own
submit through the Spark provider). Both paths return the same result.

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from .apply_batch import LocalApplier
from .apply_plan import LOCAL, SPARK, choose_path, load_schemas, resolve_tables
from .apply_run import apply_tables, run_result, target_label, target_retrier
from .apply_survey import Survey
from .config import Config, TargetConfig
from .jobs import run_spark_job
from .schema import TableSchema
from .targets import open_target
from .wiring import Wiring

log = logging.getLogger(__name__)

VIAS = ("auto", LOCAL, SPARK)


def choose_via(config: Config, target_name: str | None, tables: str | list[str] | None) -> dict:
    """Which path an apply run of ``tables`` takes: ``{"via": "local"|"spark",
    "pending_events", "local_max_events", "choose_s"}`` (``apply_plan.choose_path``)."""
    return _choose(config, target_name, tables)[0]


def _choose(config: Config, target_name: str | None, tables: str | list[str] | None) -> tuple[dict, Survey | None]:
    """:func:`choose_via`'s answer, and the survey it made (an in-process run takes it over)."""
    tcfg = config.target(target_name)
    scfg = config.source(tcfg.source)
    names = resolve_tables(scfg, tables)
    t0 = time.monotonic()
    retries, found = 0, None
    if config.apply.local_max_events <= 0:
        via, n = SPARK, -1
    else:
        target = open_target(tcfg)
        try:
            parts = Wiring(config, scfg.name)
            retry = target_retrier(target, tcfg, parts.state, config.apply.retry_for_s)
            via, n, found = retry.run(lambda: choose_path(config, target, parts.store, parts.state, scfg.name, names),
                                      f"counting the events to apply to {target_label(tcfg)}")
            retries = retry.retries
        finally:
            target.close()
    log.info("apply to %s: %s events pending (local_max_events %s): %s", tcfg.name,
             n if n >= 0 else "?", config.apply.local_max_events,
             "in-process" if via == LOCAL else "on Spark")
    return {"via": via, "pending_events": n, "local_max_events": config.apply.local_max_events,
            "choose_s": round(time.monotonic() - t0, 3)} | ({"choose_retries": retries} if retries else {}), found


def run_apply(config: Config, target_name: str | None = None, tables: str | list[str] | None = None, *,
              via: str = "auto", run_spark: Callable[[], dict] | None = None,
              schemas: dict[str, TableSchema] | None = None, schema_file: str = "") -> dict:
    """Apply ``tables`` (a list or comma-separated ``db.table``; default: all of the
    source's) to the target: ``via`` "local" (in this process), "spark" (``run_spark()``,
    which runs ``apply_job`` and returns its result) or "auto" (:func:`choose_via` picks;
    its counts are added to the result). ``schemas`` / ``schema_file``: the tables'
    schemas instead of asking the source."""
    if via not in VIAS:
        raise ValueError(f"apply via must be auto, {LOCAL} or {SPARK}, not {via!r}")
    tcfg = config.target(target_name)
    chosen: dict = {}
    found = None   # the survey counting made (engine/apply_survey.py): not made twice
    if via == "auto":
        chosen, found = _choose(config, tcfg.name, tables)
        via = chosen.pop("via")
    more = chosen.pop("choose_retries", 0)  # the target or Redis away while counting (choose_via)
    if via == LOCAL:
        result = _apply_local(config, tcfg, tables, schemas, schema_file, found, **chosen)
    else:
        if run_spark is None:
            run_spark = lambda: _submit_apply_job(config, tcfg, tables, schema_file)  # noqa: E731
        result = run_spark() | chosen
    if more:
        result["retries"] = result.get("retries", 0) + more
    return result


def _submit_apply_job(config: Config, tcfg: TargetConfig, tables: str | list[str] | None,
                      schema_file: str) -> dict:
    """``spark-submit`` of ``apply_job`` the way the ``dblog`` command runs its jobs."""
    job_args = ["--config", config.path, "--target", tcfg.name]
    if tables:
        job_args += ["--tables", tables if isinstance(tables, str) else ",".join(tables)]
    if schema_file:
        job_args += ["--schema-file", schema_file]
    return run_spark_job(config, "apply_job", job_args)


def _apply_local(config: Config, tcfg: TargetConfig, tables: str | list[str] | None,
                 schemas: dict[str, TableSchema] | None, schema_file: str, found: Survey | None = None,
                 **more) -> dict:
    """One apply run in this process (whatever its size): the same result as ``apply_job``."""
    started = time.monotonic()
    scfg = config.source(tcfg.source)
    names = resolve_tables(scfg, tables)
    parts = Wiring(config, scfg.name)
    state, store = parts.state, parts.store
    def schemas_of(tables: list[str]) -> dict[str, TableSchema]:   # (of the tables with something to apply)
        if schemas is not None:
            return {t: schemas[t] for t in tables}
        return load_schemas(scfg, tables, schema_file, config.apply.retry_for_s, store) if tables else {}
    target = open_target(tcfg)
    applier = LocalApplier(target, store, state, scfg.name)
    try:
        results, retries = apply_tables(applier, target, tcfg, scfg, store, state, schemas_of, names,
                                        config.apply.retry_for_s, found)
    finally:
        target.close()
    return run_result(tcfg, scfg, applier.run_id, results, started, LOCAL, spark_start_s=0.0, retries=retries,
                      **more)
