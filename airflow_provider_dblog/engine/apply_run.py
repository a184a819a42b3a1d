"""An apply run's tables, one after another, riding out outages (both paths: the local one,
engine/apply.py, and Spark's, spark_jobs/apply_job.py).

:func:`apply_tables` first reads what it can for all tables at once (engine/apply_survey.py):
the quiet tables (nothing to apply) have their checkpoints moved in one step and never
ask the source for their schema; every other table's batch is planned and applied
(``applier.apply_table``), then its orphan sweep runs. The target or Redis away: a step is
run again with backoff for up to ``apply.retry_for_s`` (engine/retry.py).

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from .apply_plan import with_sweep
from .apply_survey import EMPTY, Survey, survey
from .config import SourceConfig, TargetConfig
from .errors import LeaseLostError, StateLostError, TablesNotAppliedError, TargetUnavailableError
from .retry import Retrier, count_retry, redis_is_transient
from .schema import TableSchema
from .targets import name_clashes
from .targets.base import advance_applied_many

log = logging.getLogger(__name__)


def target_label(tcfg: TargetConfig) -> str:
    ep = tcfg.endpoint   # None: a lake target, named by its path
    where = tcfg.path if ep is None else f"{ep.host}:{ep.port}/{ep.database or 'postgres'}"
    return f"target {tcfg.name} ({tcfg.kind} {where})"


def target_retrier(target, tcfg: TargetConfig, state, retry_for_s: float) -> Retrier:
    """Retries of a run's steps while the target or Redis is away (counted as ``apply_retries``)."""
    def on_retry(error: BaseException) -> None:
        target.close()  # its connection is dead: the next use opens a new one
        count_retry(state, "apply_retries")
    return Retrier("apply.retry_for_s", retry_for_s, lambda e: target.is_transient(e) or redis_is_transient(e),
                   TargetUnavailableError, on_retry)


def apply_tables(applier, target, tcfg: TargetConfig, scfg: SourceConfig, store, state,
                 schemas_of: Callable[[list[str]], dict[str, TableSchema]], names: list[str],
                 retry_for_s: float, found: Survey | None = None) -> tuple[dict, int]:
    """The quiet tables' checkpoints moved at once (engine/apply_survey.py); then each other
    table's batch (``applier.apply_table``: either path's; its schema from
    ``schemas_of(tables)``), then its orphan sweep: ``({table: result}, retries)`` in the
    order of ``names``. The target or Redis away: the step runs again with
    backoff for up to ``retry_for_s`` since the outage began, then TargetUnavailableError.
    Running it again is safe: a merge that failed moved nothing (rows and checkpoint are
    one commit); one that went through moved its checkpoint, so the next plan starts after
    it (a commit whose answer was lost is not applied twice)."""
    retry = target_retrier(target, tcfg, state, retry_for_s)
    results: dict[str, dict] = {}
    errors: dict[str, Exception] = {}
    clashes = name_clashes(scfg.tables, tcfg.changelog, tcfg.name)
    what = f"the checkpoints of {len(names)} table(s) on {target_label(tcfg)}"
    # (``found``: the survey the run's choice of path made a moment ago, taken over)
    quiet = found or retry.run(lambda: survey(target, store, state, scfg.name, [t for t in names if t not in clashes]),
                               what)
    if empty := [t for t, status in quiet.quiet.items() if status == EMPTY and t not in clashes]:
        retry.run(lambda: advance_applied_many(target, scfg.name, {t: quiet.applied[t] for t in empty},
                                               quiet.frontier), what)
    if quiet.quiet:
        log.info("apply to %s: %d of %d table(s) had nothing to apply (%d checkpoint(s) moved; %.3fs)", tcfg.name,
                 len(quiet.quiet), len(names), len(empty), quiet.seconds)
    schemas = schemas_of([t for t in names if t not in clashes and t not in quiet.quiet])
    for t in names:
        if t in clashes:   # held, named (targets/__init__.py)
            results[t] = clashes[t]
            continue
        if t in quiet.quiet:
            results[t] = quiet.result(t) | {"via": applier.via}
            continue
        try:
            results[t] = _apply_one(applier, target, tcfg, scfg, store, state, schemas[t], retry)
        except (TargetUnavailableError, LeaseLostError, StateLostError):
            raise   # the target, Redis or the run itself: no table can go on
        except Exception as e:   # noqa: BLE001 - one table's failure does not stop the others
            log.exception("apply of %s to %s failed; the run goes on with the other tables", t, target_label(tcfg))
            results[t], errors[t] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}, e
    if errors:   # (the first table's error as the cause)
        raise TablesNotAppliedError(
            f"apply to {target_label(tcfg)}: {len(errors)} table(s) failed, the other {len(results) - len(errors)} "
            "went on: " + "; ".join(f"{t}: {results[t]['error']}" for t in errors), results) from next(iter(errors.values()))
    return results, retry.retries


def _apply_one(applier, target, tcfg: TargetConfig, scfg: SourceConfig, store, state, schema: TableSchema,
               retry) -> dict:
    """One table's batches (one after another across changes of shape), then its orphan sweep."""
    t = schema.qualified
    before, what = retry.retries, f"apply of {t} to {target_label(tcfg)}"
    res = last = retry.run(lambda: applier.apply_table(schema), what)
    while (last.get("evolved") and last["status"] in ("applied", "empty")) or \
            (last.get("quarantined") or {}).get("releasing"):
        # the batch ended at a change of the table's shape, which the target took, or at the
        # break a done dump releases (quarantine.settle): go on from it
        more = retry.run(lambda: applier.apply_table(schema), what)
        if "from" in more and more["from"] == last["from"]:   # the checkpoint did not move: a concurrent run took it
            break
        res, last = combined(res, more), more
    res = retry.run(lambda: with_sweep(res, target, tcfg.name, store, state, scfg, schema), what)
    return res | ({"retries": retry.retries - before} if retry.retries > before else {})


def combined(first: dict, then: dict) -> dict:
    """One table's result over its batches, one after another (a change of shape between)."""
    out = then | {k: first.get(k, 0) + then.get(k, 0) for k in
                  ("files", "events", "rows", "inserted", "updated", "deleted", "stale", "seconds",
                   "changelog_rows") if k in first or k in then}
    return out | {"from": first["from"], "seconds": round(out["seconds"], 3),
                  "evolved": first.get("evolved", []) + then.get("evolved", [])}


def run_result(tcfg: TargetConfig, scfg: SourceConfig, run_id: str, results: dict[str, dict],
               started: float, via: str, **more) -> dict:
    """The result of an apply run, the same for both paths (``apply_job`` prints it)."""
    total = lambda k: sum(r.get(k, 0) for r in results.values())  # noqa: E731
    return {"target": tcfg.name, "source": scfg.name, "run_id": run_id, "via": via, "tables": results,
            **more,
            "events": total("events"), "inserted": total("inserted"), "updated": total("updated"),
            "deleted": total("deleted"), "orphans_deleted": total("orphans_deleted"),
            "changed": [t for t, r in results.items()
                        if r.get("inserted") or r.get("updated") or r.get("deleted") or r.get("orphans_deleted")],
            "seconds": round(time.monotonic() - started, 3)}
