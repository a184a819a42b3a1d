"""How far a target is behind: its apply checkpoints, and an upper bound on its lag in seconds.

The target's apply checkpoint per table (``dblog_apply_state``) says: every event
below position ``A`` is applied. Take ``A`` = the lowest over the tables watched.

* If ``A`` is at or past the source's current log head, the target holds everything
  the source has committed: the lag is 0.
* Otherwise look up the newest *checkpoint sample* at or below ``A``. A sample
  ``(P, T)`` records that the tail's checkpoint was ``P`` at time ``T``, i.e. every
  change the tail had captured by ``T`` is below ``P <= A``, so it is applied: the lag
  is at most ``now - T`` (``RedisState.captured_at``). With no sample at or below ``A``
  yet, the lag is unknown.

The bound is measured against what the tail has captured; while the tail keeps up
that is the lag behind the source. It overestimates by at most the time between two
checkpoints, never underestimates.

Only reads: the target, Redis and the source's log head (never a write to the source),
so the lag sensor's trigger can run it in a thread.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .config import Config
from .positions import Position

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetProgress:
    """One look at a target: per table, the position below which everything is applied."""
    target: str
    applied: dict[str, Position | None]
    lag_s: float | None = None       # the upper bound, when asked for and known

    @property
    def missing(self) -> list[str]:
        """Tables with nothing applied yet."""
        return [t for t, p in self.applied.items() if p is None]

    def behind(self, want: Position) -> list[str]:
        """Tables not yet applied through every event below ``want``."""
        return [t for t, p in self.applied.items() if p is None or p < want]

    def reached(self, want: Position | None = None, max_lag_s: float | None = None) -> bool:
        """``want`` given: every table applied below it; else the lag known and <= ``max_lag_s``."""
        if want is not None:
            return not self.behind(want)
        return not self.missing and self.lag_s is not None and self.lag_s <= float(max_lag_s)

    def to_xcom(self) -> dict:
        return {"target": self.target, "lag_s": self.lag_s,
                "applied": {t: p.encode() if p else None for t, p in self.applied.items()}}


def target_progress(cfg: Config, target: str | None, tables: Sequence[str] | None = None,
                    with_lag: bool = False) -> TargetProgress:
    """The target's apply checkpoints for ``tables`` (default: every table of its source),
    and with ``with_lag`` the upper bound on its lag (module documentation)."""
    from .sources import open_source
    from .wiring import Wiring
    from .targets import open_target

    tcfg = cfg.target(target)
    scfg = cfg.source(tcfg.source)
    names = [scfg.table(t) for t in tables] if tables else list(scfg.tables)
    sink = open_target(tcfg)
    try:
        applied = {t: sink.applied_pos(scfg.name, t) for t in names}
    finally:
        sink.close()
    lag = None
    if with_lag and applied and all(p is not None for p in applied.values()):
        now = time.time()
        low = min(applied.values())
        try:
            source = open_source(scfg)
            try:
                head, _ = source.current_resume()
            finally:
                source.close()
            if low >= head:
                return TargetProgress(tcfg.name, applied, 0.0)
        except Exception as e:  # noqa: BLE001 - the source being down only loses this shortcut
            log.warning("could not read the source's log head (%s); using the checkpoint samples", e)
        state = Wiring(cfg, scfg.name).state
        try:
            at = state.captured_at(low)
        finally:
            state.r.close()
        lag = None if at is None else max(0.0, now - at)
    return TargetProgress(tcfg.name, applied, lag)
