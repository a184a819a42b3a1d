"""DBLogApplyOperator: apply the final part of the event log to a target (in-process when the
batch is small, else on Spark), with Assets."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.observability.stats import Stats

from ..assets import apply_alias, lake_table_asset, table_asset
from ..engine.errors import ConfigError, TablesNotAppliedError, UnknownTableError
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import CONFIG_ENV, DBLogHook
from .spark import DBLogSparkSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _table_list(tables: str | Sequence[str] | None) -> list[str]:
    if tables is None:
        return []
    if isinstance(tables, str):
        return [t.strip() for t in tables.split(",") if t.strip() and t.strip() != "None"]
    return [str(t).strip() for t in tables if str(t).strip()]


def target_tables_at_parse(config_path: str | None, target: str | None = None,
                           tables: str | Sequence[str] | None = None) -> tuple[str, str, list[str]] | None:
    """``(target, source, tables)`` a target applies, read from the YAML alone (DAG-parse time:
    no connection lookups, no environment expansion). None when it cannot be known yet."""
    path = config_path or os.environ.get(CONFIG_ENV)
    if not path or _templated(path) or _templated(target) or _templated(tables) or not os.path.exists(path):
        return None
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    targets = raw.get("targets") or {}
    if target is None:
        if len(targets) != 1:
            return None
        target = next(iter(targets))
    source = (targets.get(target) or {}).get("source")
    configured = [str(t) for t in ((raw.get("sources") or {}).get(source) or {}).get("tables") or []]
    if not source or not configured:
        return None
    wanted = _table_list(tables)
    return str(target), str(source), [t for t in wanted if t in configured] if wanted else configured


class DBLogApplyOperator(DBLogSparkSubmitOperator):
    """Apply the event log to a target: in-process when small, else ``spark_jobs/apply_job.py``
    via ``spark-submit``.

    For each table, the events between the target's apply checkpoint and the frontier
    (the tail's checkpoint, held back by open dump windows) are reduced to the latest per
    key and merged into the target in one transaction that also moves the checkpoint; a
    replayed batch changes nothing.

    The run is :func:`airflow_provider_dblog.engine.apply.run_apply`: it first counts the
    events waiting in its tables; up to the config's ``apply.local_max_events`` it applies
    them in the task's own process (pyarrow, ``COPY``, the same merge), with no Spark
    start-up; above it (or with ``local_max_events: 0``) it submits the job through the
    Spark provider (:meth:`run_job`). The result, the XCom and the asset events are the
    same either way; the result's ``via`` says which ran. The Spark connection
    is checked on every run, so a large batch can always fall back to Spark.

    Its outlet is the AssetAlias ``dblog.apply.<target>``
    (:func:`~airflow_provider_dblog.assets.apply_alias`; the target is read from the config
    when the DAG is parsed, so ``config_path`` and ``target`` must be plain strings there, or
    ``$DBLOG_CONFIG`` set). After success it adds an event to the per-table Asset
    ``dblog://<source>/<db>/<table>`` (:func:`~airflow_provider_dblog.assets.table_asset`)
    of each table whose target rows the run changed, and to no other: a consumer DAG
    scheduled on a table's Asset runs only when there is new data. The event's ``extra``
    is ``{"target", "status", "events", "inserted", "updated", "deleted",
    "orphans_deleted", "position"}``, ``position`` being the encoded position the table is
    applied up to. Into a lake target (Delta, Iceberg) the run also adds an event to the
    lake table's own Asset (:func:`~airflow_provider_dblog.assets.lake_table_asset`: the
    Delta table's location, ``iceberg://...``), and ``extra`` has ``version`` (the Delta
    version / Iceberg snapshot id the run made). Outlets you pass are kept instead (Airflow then emits an event for each
    of your Assets after every successful run, with the same ``extra`` where it names a
    table).

    Returns the job's result (XCom): ``tables`` (per table: ``status``, ``from``, ``to``,
    ``events``, ``inserted``, ``updated``, ``deleted``, ...) and totals. Metrics:
    ``dblog.apply.rows`` (counter: inserted + updated + deleted) and ``dblog.apply.events``
    (counter), tagged with source, target and table.

    :param config_path: the dblog YAML config (templated; a plain path for the outlets).
    :param target: the target name (templated); optional with one target.
    :param tables: a subset of the source's tables, a list or comma-separated ``db.table``
        (templated); default: all of them.
    :param conn_id: the Spark connection (default ``spark_default``).
    :param kwargs: :class:`DBLogSparkSubmitOperator` / ``SparkSubmitOperator`` arguments.

    Example::

        DBLogApplyOperator(task_id="apply", config_path="/opt/dblog/dblog.yaml", target="warehouse")
    """

    template_fields: Sequence[str] = (*DBLogSparkSubmitOperator.template_fields, "target", "tables")
    ui_color = "#c9f0d0"

    def __init__(self, *, config_path: str | None = None, target: str | None = None,
                 tables: str | list[str] | None = None, outlets: Any = None, **kwargs: Any) -> None:
        if outlets is None:
            found = target_tables_at_parse(config_path, target, tables)
            outlets = [apply_alias(found[0])] if found else []
        super().__init__(job="apply_job", config_path=config_path, outlets=outlets, **kwargs)
        self.target = target
        self.tables = tables

    def _target(self, hook: DBLogHook):
        name = None if self.target in (None, "", "None") else str(self.target)
        try:
            tcfg = hook.config.target(name)
            scfg = hook.config.source(tcfg.source)
            return tcfg, scfg, [scfg.table(t) for t in _table_list(self.tables)]
        except (ConfigError, UnknownTableError) as e:
            raise DBLogInvalidRequest(str(e)) from e

    def execute(self, context: Context) -> Any:
        from ..engine.apply import run_apply  # pyarrow: not at DAG parse time

        self._hook = None
        self.check_spark_connection()  # the fallback must work whatever this run's size
        hook = self.dblog_hook()
        tcfg, _, tables = self._target(hook)
        try:
            result = run_apply(hook.config, tcfg.name, tables or None, run_spark=lambda: self.run_job(hook, context))
        except TablesNotAppliedError as e:   # the tables applied still get their events, then the task fails
            self.handle_result({"tables": e.results}, hook, context)
            raise
        return self.handle_result(result, hook, context)

    def job_arguments(self, hook: DBLogHook, context: Context) -> list[str]:
        tcfg, scfg, tables = self._target(hook)
        args = ["--target", tcfg.name]
        if tables:
            args += ["--tables", ",".join(tables)]
        return args

    def handle_result(self, result: dict, hook: DBLogHook, context: Context) -> dict:
        tcfg, scfg, _ = self._target(hook)
        outlet_events = context.get("outlet_events")
        alias = next((o for o in self.outlets or [] if isinstance(o, AssetAlias)), None)
        given = {o.uri: o for o in self.outlets or [] if isinstance(o, Asset)}
        for table, r in (result.get("tables") or {}).items():
            rows = sum(int(r.get(k) or 0) for k in ("inserted", "updated", "deleted", "orphans_deleted"))
            tags = {"source": scfg.name, "target": tcfg.name, "table": table}
            Stats.incr("dblog.apply.rows", rows, tags=tags)
            Stats.incr("dblog.apply.events", int(r.get("events") or 0), tags=tags)
            self.log.info("%s -> %s: %s, %s events, %s inserted, %s updated, %s deleted, applied up to %s%s",
                          table, tcfg.name, r.get("status"), r.get("events"), r.get("inserted"),
                          r.get("updated"), r.get("deleted"), r.get("to"),
                          f"; orphan sweep of a full dump: {r['orphans_deleted']} rows deleted"
                          if "orphans_deleted" in r else "")
            if r.get("held"):
                # a value no target can hold: this table stops before it, the others go on
                self.log.error("%s -> %s: apply held at %s: %s. Fix the value at the source (any "
                               "later change of the row releases it) or re-dump the row.",
                               table, tcfg.name, r["held"]["at"], r["held"]["error"])
            if r.get("status") == "failed":   # its own error (TablesNotAppliedError): the others went on
                self.log.error("%s -> %s: apply failed, it stays where it was: %s", table, tcfg.name, r["error"])
            if r.get("quarantined"):
                # a schema change its target cannot follow: this table stops before it, the others go on
                q = r["quarantined"]
                self.log.error("%s -> %s: quarantined, applied up to %s: %s. To release it, %s.",
                               table, tcfg.name, q["at"], q["why"], q["fix"])
            if outlet_events is None:
                continue
            extra = {"target": tcfg.name, "status": r.get("status"), "events": r.get("events"),
                     "inserted": r.get("inserted"), "updated": r.get("updated"), "deleted": r.get("deleted"),
                     "orphans_deleted": r.get("orphans_deleted", 0), "position": r.get("to")}
            if r.get("uri"):   # a lake table: its version (Delta version / Iceberg snapshot id) too
                extra["version"] = r.get("version")
            asset = table_asset(scfg.name, table)
            if alias is not None and rows:   # only a table whose target rows changed
                outlet_events[alias].add(asset, extra=extra)
                if r.get("uri"):   # and the lake table's own Asset, for readers of the lake table
                    outlet_events[alias].add(lake_table_asset(tcfg.name, table, r["uri"]), extra=extra)
            if asset.uri in given:   # an Asset the user made an outlet: Airflow emits it anyway
                outlet_events[given[asset.uri]].extra = extra
        return result
