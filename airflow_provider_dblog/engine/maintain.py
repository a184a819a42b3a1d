"""One maintenance run of a target's tables: :func:`run_maintain`, the one entry point (the
``dblog maintain`` command and DBLogMaintainOperator call it).

A lake target compacts its small files and removes what its retention allows
(targets/delta_maintain.py, targets/iceberg_maintain.py), table by table, beside readers
and a running apply. A PostgreSQL target has nothing to do: autovacuum keeps its tables.

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging

from .config import Config
from .targets import open_target, target_table_name

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 168   # a week of time travel


def run_maintain(config: Config, target_name: str | None = None, tables: str | list[str] | None = None,
                 retention_hours: float = DEFAULT_RETENTION_HOURS, dry_run: bool = False,
                 z_order: bool = False) -> dict:
    """Maintain ``tables`` (a list or comma-separated ``db.table``; default: every table of
    the target): ``{"target", "kind", "status", "tables": {name: report}}``, each report
    with the files (and bytes) before and after. Raises ValueError for an unknown table or
    a retention the target refuses."""
    tcfg = config.target(target_name)
    out = {"target": tcfg.name, "kind": tcfg.kind, "tables": {}}
    with open_target(tcfg) as target:
        if not hasattr(target, "maintain"):
            return out | {"status": "nothing to do", "why": "PostgreSQL's autovacuum keeps its tables"}
        if isinstance(tables, str):
            tables = [t.strip() for t in tables.split(",") if t.strip()]
        known = target.table_names()
        names = [target_table_name(t) for t in tables] if tables else known
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"target {tcfg.name} has no table(s) {', '.join(missing)}; it has: "
                             f"{', '.join(known) or 'none yet'}")
        for name in names:
            report = target.maintain(name, retention_hours=retention_hours, dry_run=dry_run, z_order=z_order)
            out["tables"][name] = report.to_dict()
            log.info("maintained %s.%s: %s", tcfg.name, name, out["tables"][name])
    return out | {"status": "dry run" if dry_run else "done"}
