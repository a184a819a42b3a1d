"""What an apply run reads once for all its tables (issue 30: a run with a few changed tables
among 1,000 costs about what it costs with a few).

:func:`survey` reads, for every table of the run at once: the frontier; the target's
checkpoints and which of its tables exist (one read where the target can:
``targets.base.checkpoints``); the quarantine and sweep records (one read each); the event
store's file names (one listing). From those it finds the *quiet* tables: the ones whose
batch :func:`apply_plan.plan_table` would find empty, with nothing to settle on the way, so
that the only thing their apply does is move the checkpoint over an empty range (or
nothing: up to date). A quiet table:

* exists in the target and has a checkpoint ``A`` (else the plan creates or resets it);
* has no quarantine record and no orphan sweep pending for this target (``settle``,
  ``with_sweep``);
* has a recorded schema version (else its shape is the source catalog's), none after
  ``A`` up to the frontier (``next_change``), and the target holds the shape at ``A``
  (``release_refused_shape``; not a version whose behaviour is ``ignore``);
* has no log or snapshot file with an event at ``A <= pos < frontier``
  (``store.files_with_events``: Parquet statistics, then the ``pos`` column);
* and the target keeps no changelog (an empty batch still writes to a changelog table).

Every other table is planned by ``plan_table`` as before; quiet tables never ask the source
catalog for their schema. The checkpoints of the quiet tables move in one step
(``targets.base.advance_applied_many``). tests/integration/test_apply_survey.py runs
generated situations through a run with the survey and one without, and requires the same
target tables, checkpoints and results.

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from .positions import Position
from .quarantine import quarantined_names, refusal
from .schema import TableSchema
from .schema_evolution import IGNORE
from .targets.base import checkpoints

log = logging.getLogger(__name__)

EMPTY, UP_TO_DATE = "empty", "up_to_date"


@dataclass
class Survey:
    """``quiet``: {table: EMPTY or UP_TO_DATE}; ``applied``: the quiet tables' checkpoints."""
    frontier: Position | None
    quiet: dict[str, str] = field(default_factory=dict)
    applied: dict[str, Position] = field(default_factory=dict)
    seconds: float = 0.0

    def result(self, table: str) -> dict:
        """A quiet table's result, as ``plan_table`` gives it for an empty batch."""
        return {"from": self.applied[table].encode(), "to": self.frontier.encode(),
                "files": 0, "events": 0, "rows": 0, "inserted": 0, "updated": 0, "deleted": 0, "stale": 0,
                "status": self.quiet[table], "seconds": 0.0}


def survey(target, store, state, source_name: str, tables: list[str]) -> Survey:
    """The run's quiet tables among ``tables`` (module documentation); read-only. A table
    whose survey meets an error of its own (a damaged file, a target table that cannot be
    read) is not quiet: ``plan_table`` meets the error, where it stops only that table (the
    target away still stops the run: retried as every step)."""
    t0 = time.monotonic()
    frontier = state.frontier()
    out = Survey(frontier)
    if frontier is None or getattr(target.config, "changelog", False) or not tables:
        return out
    held = quarantined_names(state) | state.pending_sweeps(target.config.name)
    marks = checkpoints(target, source_name, [t for t in tables if t not in held])
    listed = store.listing()
    for table, (there, applied) in marks.items():
        try:
            status = _quiet(target, store, table, there, applied, frontier, listed.get(table, []))
        except Exception as e:   # noqa: BLE001 - the table's own trouble: planned table by table
            if target.is_transient(e):
                raise
            log.warning("apply survey: %s is planned table by table (%s: %s)", table, type(e).__name__, e)
            continue
        if status is not None:
            out.quiet[table], out.applied[table] = status, applied
    out.seconds = round(time.monotonic() - t0, 3)
    return out


def _quiet(target, store, table: str, there: bool, applied: Position | None, frontier: Position,
           files: list) -> str | None:
    """EMPTY or UP_TO_DATE if the table is quiet (module documentation), else None."""
    if not there or applied is None:
        return None
    versions = store.schema_version_files(table, files)
    if not versions or any(applied < at <= frontier for at, _ in versions):
        return None
    if not getattr(target, "holds_every_shape", False):   # (a lake table refuses some: check_table)
        holding = [path for at, path in versions if at <= applied]
        version = store.read_schema_version(holding[-1] if holding else versions[0][1])
        if version.get("behaviour") == IGNORE or refusal(target, TableSchema.from_dict(version["schema"])):
            return None
    if applied >= frontier:
        return UP_TO_DATE
    return None if store.files_with_events(table, applied, frontier, files) else EMPTY
