"""DBLogMaintainOperator: compaction and cleanup of a lake target's tables."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.observability.stats import Stats

from ..engine.errors import ConfigError
from ..engine.requests import blank
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHookMixin

if TYPE_CHECKING:
    from airflow.sdk import Context


def _flag(value: Any, name: str) -> bool:
    """A boolean argument, or the text a template rendered it to."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise DBLogInvalidRequest(f"{name} must be true or false, not {value!r}")


class DBLogMaintainOperator(DBLogHookMixin, BaseOperator):
    """Compact a lake target's small files and remove what its retention allows, table by
    table (``engine.maintain.run_maintain``; ``dblog maintain`` runs the same).

    Frequent merges make small files. A Delta table is compacted (optionally z-ordered by
    its key) and vacuumed; an Iceberg table's small files are rewritten sorted by key,
    its snapshots older than the retention expire and data files no snapshot references
    are deleted. Rows and the applied position never change, readers are never broken
    (time travel within the retention keeps working), and an apply running meanwhile
    either commits first (then the maintenance commit is retried) or retries itself. A
    PostgreSQL target has nothing to do (the task says so and succeeds).

    Returns (XCom) ``{"target", "kind", "status", "tables": {table: report}}``, each report
    with ``files_before`` / ``files_after`` and bytes; metrics ``dblog.maintain.files``
    (gauge: files after) tagged with target and table.

    :param config_path: the dblog YAML (templated); default: the ``dblog`` connection, else
        ``$DBLOG_CONFIG``.
    :param target: the target name (templated); optional with one target.
    :param tables: ``db.table`` list or comma-separated text (templated); default: all.
    :param retention_hours: whole hours of time travel kept (templated; default 168, a week).
    :param dry_run: count only (templated).
    :param z_order: Delta: rewrite the table clustered by its key (templated).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.

    Example::

        DBLogMaintainOperator(task_id="maintain", config_path="/opt/dblog/dblog.yaml", target="lake")
    """

    template_fields: Sequence[str] = ("config_path", "target", "tables", "retention_hours", "dry_run", "z_order")
    ui_color = "#efe3c8"

    def __init__(self, *, config_path: str | None = None, target: str | None = None,
                 tables: str | list[str] | None = None, retention_hours: float | str = 168,
                 dry_run: bool | str = False, z_order: bool | str = False, dblog_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_dblog_config(config_path, dblog_conn_id, None)
        self.target = target
        self.tables = tables
        self.retention_hours = retention_hours
        self.dry_run = dry_run
        self.z_order = z_order

    def execute(self, context: Context) -> dict:
        from ..engine.maintain import run_maintain   # pyarrow and the lake libraries: not at parse time

        try:
            hours = float(self.retention_hours)
        except (TypeError, ValueError):
            hours = 0.5   # refused below
        if not hours.is_integer() or hours < 1:
            raise DBLogInvalidRequest(f"retention_hours must be a whole number of hours >= 1, "
                                      f"not {self.retention_hours!r}")
        hook = self.dblog_hook()
        tables = None if blank(self.tables) else self.tables
        try:
            result = run_maintain(hook.config, None if blank(self.target) else str(self.target), tables,
                                  retention_hours=int(hours), dry_run=_flag(self.dry_run, "dry_run"),
                                  z_order=_flag(self.z_order, "z_order"))
        except (ConfigError, ValueError) as e:
            raise DBLogInvalidRequest(str(e)) from e
        if not result["tables"]:
            self.log.info("%s (%s): %s", result["target"], result["kind"], result.get("why") or "no tables yet")
        for table, r in result["tables"].items():
            self.log.info("%s.%s: %s -> %s files (%s -> %s bytes)%s", result["target"], table, r["files_before"],
                          r["files_after"], r["bytes_before"], r["bytes_after"], " (dry run)" if r["dry_run"] else "")
            Stats.gauge("dblog.maintain.files", r["files_after"], tags={"target": result["target"], "table": table})
        return result
