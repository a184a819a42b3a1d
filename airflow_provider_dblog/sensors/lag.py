"""DBLogLagSensor: wait until a target has applied the log up to a position, or to within N seconds.

How the lag is computed (``max_lag_seconds``)
---------------------------------------------
The target's apply checkpoint per table (``dblog_apply_state``) says: every event
below position ``A`` is applied. Take ``A`` = the lowest over the tables watched.

* If ``A`` is at or past the source's current log head (read at the poke), the
  target holds everything the source has committed: the lag is 0.
* Otherwise the sensor looks up the newest *checkpoint sample* at or below ``A``.
  A sample ``(P, T)`` records that the tail's checkpoint was ``P`` at time ``T``
  (``T`` is the checkpoint's own ``updated_at``), i.e. every change the tail had
  captured by ``T`` is below ``P <= A``, so it is applied: the lag is at most
  ``now - T``. The tail records a sample with every checkpoint it commits (in the
  same fenced Redis script; the last 10,000 are kept,
  ``RedisState.captured_at``). With no sample at or below ``A`` yet, the lag is
  unknown and the sensor keeps waiting.

The lag is measured against what the tail has captured; while the tail keeps up
(``dblog.tail.lag_seconds``, about ``tail.flush_seconds``) that is the lag behind
the source. It is an upper bound: it overestimates by at most the time between
two checkpoints (``tail.flush_seconds`` while changes flow), never underestimates.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from ..engine.errors import ConfigError, UnknownTableError
from ..engine.positions import Position
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook

if TYPE_CHECKING:
    from airflow.sdk import Context

class DBLogLagSensor(BaseSensorOperator):
    """Wait until a target has applied the change log up to ``position``, or until it is at
    most ``max_lag_seconds`` behind (set exactly one).

    Each poke is a few quick reads (the target's apply checkpoints, Redis, the source's log
    head) and never blocks, so ``mode="reschedule"`` suits long waits.

    * ``position``: an encoded ``Position`` (e.g. a tail task's XCom ``end`` checkpoint):
      satisfied when, for every watched table, every event below it is applied;
    * ``max_lag_seconds``: satisfied when the lag is at most that; see the module's
      documentation for how the lag is computed (an upper bound, measured against what the
      tail has captured, 0 when the target has everything up to the source's log head).

    Returns (XCom, via ``PokeReturnValue``) ``{"applied": {table: position}, "lag_s": ...}``.

    :param config_path: the dblog YAML config (templated).
    :param target: the target name (templated); optional with one target.
    :param table: a table ``db.table``, or a list of them (templated); default: every table
        of the target's source.
    :param position: the position to wait for (templated).
    :param max_lag_seconds: the lag to wait for (templated).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.

    Example::

        DBLogLagSensor(task_id="caught_up", config_path="/opt/dblog/dblog.yaml",
                       position="{{ ti.xcom_pull(task_ids='tail')['end'] }}",
                       mode="reschedule", poke_interval=30, timeout=3600)
    """

    template_fields: Sequence[str] = ("config_path", "target", "table", "position", "max_lag_seconds")
    ui_color = "#d5f5e3"

    def __init__(self, *, config_path: str | None = None, target: str | None = None,
                 table: str | list[str] | None = None, position: str | None = None,
                 max_lag_seconds: float | str | None = None, dblog_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (position is None) == (max_lag_seconds is None):
            raise DBLogInvalidRequest("DBLogLagSensor: set exactly one of position and max_lag_seconds")
        self.config_path = config_path
        self.target = target
        self.table = table
        self.position = position
        self.max_lag_seconds = max_lag_seconds
        self.dblog_conn_id = dblog_conn_id

    def _want(self) -> tuple[Position | None, float | None]:
        if self.position is not None and str(self.position).strip() not in ("", "None"):
            try:
                return Position.decode(str(self.position).strip()), None
            except ValueError:
                raise DBLogInvalidRequest(
                    f"position {self.position!r} is not an encoded position such as "
                    "'00000001-0000000000000abc-00000000' (a tail task's 'end')") from None
        if self.max_lag_seconds is not None and str(self.max_lag_seconds).strip() not in ("", "None"):
            try:
                lag = float(self.max_lag_seconds)
            except (TypeError, ValueError):
                raise DBLogInvalidRequest(f"max_lag_seconds must be a number, not {self.max_lag_seconds!r}") from None
            if lag < 0:
                raise DBLogInvalidRequest(f"max_lag_seconds must not be negative, not {lag}")
            return None, lag
        raise DBLogInvalidRequest("DBLogLagSensor: position (or max_lag_seconds) rendered empty")

    def _tables(self, source_tables: Sequence[str], source_cfg) -> list[str]:
        t = self.table
        if t is None or (isinstance(t, str) and t.strip() in ("", "None")):
            return list(source_tables)
        names = [x.strip() for x in t.split(",")] if isinstance(t, str) else [str(x).strip() for x in t]
        try:
            return [source_cfg.table(n) for n in names if n]
        except UnknownTableError as e:
            raise DBLogInvalidRequest(str(e)) from e

    def poke(self, context: Context):
        from airflow.sdk import PokeReturnValue

        want_pos, max_lag = self._want()
        hook = DBLogHook(config_path=self.config_path, dblog_conn_id=self.dblog_conn_id)
        try:
            tcfg = hook.config.target(None if self.target in (None, "", "None") else str(self.target))
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e
        scfg = hook.config.source(tcfg.source)
        tables = self._tables(scfg.tables, scfg)
        target = hook.target(tcfg.name)
        try:
            applied = {t: target.applied_pos(scfg.name, t) for t in tables}
        finally:
            target.close()
        shown = {t: p.encode() if p else None for t, p in applied.items()}
        if any(p is None for p in applied.values()):
            self.log.info("not yet applied to %s: %s", tcfg.name, [t for t, p in applied.items() if p is None])
            return False
        low = min(applied.values())
        if want_pos is not None:
            behind = [t for t, p in applied.items() if p < want_pos]
            self.log.info("waiting for %s at %s: %s", tcfg.name, want_pos,
                          f"behind: {behind}" if behind else "every table is there")
            return PokeReturnValue(is_done=not behind, xcom_value={"applied": shown, "position": str(want_pos)})
        lag = self.lag_seconds(hook, scfg.name, low)
        done = lag is not None and lag <= max_lag
        self.log.info("target %s applied up to %s: lag %s (wanted <= %.1f s)", tcfg.name, low,
                      "unknown (no checkpoint sample at or below it yet)" if lag is None else f"<= {lag:.1f} s",
                      max_lag)
        return PokeReturnValue(is_done=done, xcom_value={"applied": shown, "lag_s": lag})

    def lag_seconds(self, hook: DBLogHook, source_name: str, applied: Position) -> float | None:
        """An upper bound on the target's lag (see the module documentation); None if unknown."""
        now = time.time()
        state = hook.state(source_name)
        try:
            source = hook.source(source_name)
            try:
                head, _ = source.current_resume()
            finally:
                source.close()
            if applied >= head:
                return 0.0
        except Exception as e:  # noqa: BLE001 - the source being down only loses this shortcut
            self.log.warning("could not read the source's log head (%s); using the checkpoint samples", e)
        at = state.captured_at(applied)
        return None if at is None else max(0.0, now - at)
