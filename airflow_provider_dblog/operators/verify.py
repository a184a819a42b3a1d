"""DBLogVerifyOperator: a target compared with its source under writes, and repaired if asked."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.observability.stats import Stats

from ..assets import verify_asset
from ..engine.errors import ConfigError, InvalidKeyError, UnknownTableError
from ..engine.requests import blank, parse_spec
from ..exceptions import DBLogInvalidRequest, DBLogVerificationFailed
from ..hooks.dblog import DBLogHook
from .maintain import _flag
from .spark import DBLogSparkSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

COUNTS = ("compared", "skipped", "missing", "extra", "different")


class DBLogVerifyOperator(DBLogSparkSubmitOperator):
    """Verify a target against its source while both keep changing (``dblog verify``:
    :func:`airflow_provider_dblog.engine.verify_run.run_verify`; README, Verification and
    repair): each chunk read inside a watermark window, the target read once past every HW,
    the keys the log changed meanwhile left out, so there are no false positives.

    Without ``table``: every table of the target's source (chunks on Spark through this
    operator's Spark connection); with ``keys`` or ``where``: only those rows (read in the
    task's process). ``repair``: the keys that differ are dumped, applied and verified again.

    Its outlet is the Asset ``dblog-verify://<target>``
    (:func:`~airflow_provider_dblog.assets.verify_asset`): every finished verification adds an
    event whose ``extra`` has the counts per table (``compared``, ``skipped``, ``missing``,
    ``extra``, ``different``, ``equal``, ``at``). A table that differs (and was not repaired)
    fails the task with :class:`~airflow_provider_dblog.exceptions.DBLogVerificationFailed`,
    the report in its log (Airflow adds no Asset event for a failed task: with
    ``fail_on_difference=False`` the task succeeds and :func:`raise_if_differs` in a next task
    fails the run, as the shipped ``dblog_verify__<source>`` does). Returns the report (XCom).
    Metric ``dblog.verify.different_keys`` (gauge) per table.

    :param config_path: the dblog YAML (templated); default: the ``dblog`` connection, else ``$DBLOG_CONFIG``.
    :param target: the target (templated); optional with one target.
    :param scope: ``all`` / ``table`` / ``keys`` / ``where`` (templated; the form's); default: from
        the fields given (no table: all).
    :param table: one ``db.table`` (templated); empty: every table.
    :param keys: a key list in any syntax ``dblog dump --keys`` takes (templated).
    :param where: a condition on the table's columns (templated; bound parameters, as a dump's).
    :param repair: dump, apply and verify again the keys that differ (templated).
    :param wait_s: how long the target's apply may take to pass the chunks' HW.
    :param fail_on_difference: fail the task when a table differs (default); False: succeed
        (its Asset event is added) and leave the verdict to :func:`raise_if_differs`.
    """

    template_fields: Sequence[str] = (*DBLogSparkSubmitOperator.template_fields, "target", "scope", "table",
                                      "keys", "where", "repair")
    ui_color = "#d4e8f9"

    def __init__(self, *, config_path: str | None = None, target: str | None = None, scope: str | None = None,
                 table: str | None = None,
                 keys: Any = None, where: str | None = None, repair: bool | str = False, wait_s: float = 600.0,
                 fail_on_difference: bool = True, outlets: Any = None, **kwargs: Any) -> None:
        if outlets is None and target and "{{" not in str(target):
            outlets = [verify_asset(str(target))]
        super().__init__(job="dump_job", config_path=config_path, outlets=outlets or [], **kwargs)
        self.target, self.scope, self.table, self.keys, self.where = target, scope, table, keys, where
        self.repair = repair
        self.wait_s, self.fail_on_difference = wait_s, fail_on_difference
        self._request: str | None = None

    def job_arguments(self, hook: DBLogHook, context: Context) -> list[str]:
        source = hook.config.target(None if blank(self.target) else str(self.target)).source
        return ["--source", source, "--request", str(self._request)]

    def execute(self, context: Context) -> dict:
        from ..engine.verify_run import run_verify   # pyarrow: not at DAG parse time
        hook = self.dblog_hook()
        try:
            tcfg = hook.config.target(None if blank(self.target) else str(self.target))
            table = None if blank(self.table) else str(self.table).strip()
            scope = str(self.scope).strip() if not blank(self.scope) else "all" if table is None else (
                "keys" if not blank(self.keys) else "where" if not blank(self.where) else "table")
            spec = parse_spec(scope, None if scope == "all" else table, self.keys if scope == "keys" else None,
                              self.where if scope == "where" else None)
        except (ConfigError, InvalidKeyError, UnknownTableError) as e:
            raise DBLogInvalidRequest(str(e)) from e
        via = "local" if spec.by_keys else "spark"
        if via == "spark":
            self.check_spark_connection()

        def on_spark(rid: str) -> dict:
            self._request = rid
            return self.run_job(hook, context)
        try:
            result = run_verify(hook.config, tcfg.name, spec, repair=_flag(self.repair, "repair"), via=via,
                                wait_s=float(self.wait_s), run_spark=on_spark)
        except (ConfigError, InvalidKeyError, UnknownTableError) as e:
            raise DBLogInvalidRequest(str(e)) from e
        counts = {t: {k: r[k] for k in (*COUNTS, "equal", "at")} for t, r in result["tables"].items()}
        for t, r in result["tables"].items():
            self.log.info("%s on %s at %s: %s", t, tcfg.name, r["at"], "equal" if r["equal"] else
                          f"not verified: {r['incomplete'] or r['error']}" if r["incomplete"] or r["error"] else
                          f"{r['missing']} missing {r['keys']['missing'][:20]}, {r['extra']} extra "
                          f"{r['keys']['extra'][:20]}, {r['different']} different {r['keys']['different'][:20]}")
            self.log.info("%s: %d compared, %d changing keys left out", t, r["compared"], r["skipped"])
            Stats.gauge("dblog.verify.different_keys", r["missing"] + r["extra"] + r["different"],
                        tags={"target": tcfg.name, "table": t})
        for t, fix in (result.get("repair") or {}).items():
            if fix.get("error"):
                self.log.error("%s: the repair of %d key(s) failed: %s", t, fix["keys"], fix["error"])
            else:
                self.log.warning("%s: %d key(s) repaired by dump request %s: %s", t, fix["keys"], fix["request"],
                                 "now equal" if fix["equal"] else f"still differs: {fix['report']}")
            counts[t]["repaired"] = fix["equal"]
        outlet_events = context.get("outlet_events")
        for outlet in self.outlets or []:
            if outlet_events is not None and getattr(outlet, "uri", "").startswith("dblog-verify://"):
                outlet_events[outlet].extra = {"target": tcfg.name, "request": result["request"], "tables": counts}
        if self.fail_on_difference:
            raise_if_differs(result)
        return result


def raise_if_differs(result: dict) -> None:
    """DBLogVerificationFailed when a verification's result (DBLogVerifyOperator's XCom) has a
    table that differs and was not repaired, naming the tables and their counts."""
    if result["equal"] or result.get("repaired"):
        return
    fixes = result.get("repair") or {}
    repaired = {t for t, fix in fixes.items() if fix["equal"]}
    failed = {t: fix["error"] for t, fix in fixes.items() if fix.get("error")}
    differing = {t: {k: r[k] for k in ("missing", "extra", "different")} for t, r in result["tables"].items()
                 if not r["equal"] and not r["incomplete"] and not r["error"] and t not in repaired | set(failed)}
    unverified = [t for t, r in result["tables"].items() if r["incomplete"]]
    tgt, rid = result["target"], result["request"]
    parts = []
    if differing:
        parts.append(f"target {tgt} differs from its source in {', '.join(f'{t} {c}' for t, c in differing.items())} "
                     f"(verification {rid}: the keys are in the verify task's log; repair=true repairs them)")
    if unverified:
        parts.append(f"{', '.join(unverified)} could not be verified on target {tgt}: each changed shape during "
                     f"every attempt (verification {rid}); verify again")
    parts += [f"{t} could not be verified on target {tgt}: {r['error']}"
              for t, r in result["tables"].items() if r["error"]]
    parts += [f"{t} differs on target {tgt} and its repair failed: {why}" for t, why in failed.items()]
    raise DBLogVerificationFailed("; ".join(parts))
