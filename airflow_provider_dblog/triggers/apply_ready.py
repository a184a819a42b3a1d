"""ApplyReadyTrigger: the AssetWatcher trigger of the event-driven apply DAG.

It runs in the triggerer for as long as the apply DAG is scheduled on its Asset, and yields
an event each time the target has something new to apply (``engine.apply_ready``: new
events below the tail's frontier that the target's checkpoint has not passed; at most every
``refire_seconds`` for a frontier that moved over nothing of the source's tables, or to
retry after a failed run). Each event becomes an Asset event, and the scheduler starts
``dblog_apply__<target>``.

One event per apply run: after an event, none until the target's checkpoint has moved
(that run takes everything below the frontier it reads); a change committed while the run
is active fires as soon as the run has moved the target, so it is never left behind.

Each look reads Redis with ``redis.asyncio``; the target's apply checkpoints (a database
round trip, the same read as the lag sensor's) are read in a worker thread and only when
Redis says there is something new. It never writes anywhere and never connects to the
source. Its serialized kwargs hold no secret and do not change between DAG parses (the
watcher's identity is their hash): connections are resolved in ``run()``.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from ..engine.apply_ready import ApplyGate, AsyncApplyReader
from .config import load_config_async


class ApplyReadyTrigger(BaseEventTrigger):
    """Fires whenever ``target`` is behind the frontier of its source's log.

    :param config_path: the dblog YAML (readable by the triggerer).
    :param target: the target name (None: the config's only target).
    :param poll_interval: seconds between two looks at Redis.
    :param refire_seconds: while the target stays behind with nothing new, fire again
        after this long (an apply run that failed is retried; a checkpoint that moved over
        other tables' log is applied).
    """

    def __init__(self, *, config_path: str, target: str | None = None, poll_interval: float = 1.0,
                 refire_seconds: float = 60.0) -> None:
        super().__init__()
        self.config_path = config_path
        self.target = target
        self.poll_interval = float(poll_interval)
        self.refire_seconds = float(refire_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"config_path": self.config_path, "target": self.target, "poll_interval": self.poll_interval,
                 "refire_seconds": self.refire_seconds})

    async def _config(self):
        """The config, read again until it is usable (a watcher that ended would be restarted
        by the triggerer at once, over and over)."""
        while True:
            try:
                cfg = await load_config_async(self.config_path)
                tcfg = cfg.target(self.target)
                return cfg, tcfg, cfg.source(tcfg.source)
            except Exception as e:  # noqa: BLE001 - reported, and read again
                self.log.error("cannot use config %s for target %s: %s: %s; reading it again in %.0fs",
                               self.config_path, self.target or "(default)", type(e).__name__, e,
                               self.refire_seconds)
            await asyncio.sleep(self.refire_seconds)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from ..engine.lag import target_progress

        cfg, tcfg, scfg = await self._config()
        self.log.info("watching %s:%s for work for target %s", cfg.state_prefix, scfg.name, tcfg.name)
        reader = AsyncApplyReader(cfg.redis_url, cfg.state_prefix, scfg.name)
        gate = ApplyGate(self.refire_seconds)
        last_error = ""
        try:
            while True:
                try:
                    look = await reader.look()
                    if gate.worth_reading_target(look, time.monotonic()):
                        progress = await asyncio.to_thread(target_progress, cfg, tcfg.name)
                        if gate.decide(look, progress.applied, time.monotonic()):
                            yield TriggerEvent({
                                "source": scfg.name, "target": tcfg.name, "frontier": look.frontier.encode(),
                                "applied": gate.applied_low.encode() if gate.applied_low else None,
                                "events_tailed": look.generation[0], "at": time.time()})
                    last_error = ""
                except Exception as e:  # noqa: BLE001 - a server away for a moment: keep watching
                    if str(e) != last_error:
                        self.log.warning("looking for work for %s failed (%s: %s); still watching",
                                         tcfg.name, type(e).__name__, e)
                    last_error = str(e)
                await asyncio.sleep(self.poll_interval)
        finally:
            await reader.close()
