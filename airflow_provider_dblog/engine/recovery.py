"""Lost state fails closed, and the one way back from it: ``dblog reset``.

The tail refuses to guess where to start (``Tail.run``):

* no checkpoint in Redis while the source's event store (or what is left in Redis) shows
  that it was captured before: StateLostError (``earlier_history``). Starting at the log
  head would skip every change between the targets' positions and the head;
* a checkpoint whose log is gone (a purged binlog, a dropped or advanced slot):
  LogGapError (``Source.log_gap``).

Both name ``reset_source``: it clears the source's state, event store and the targets'
applied positions, and requests a full dump of every table, whose orphan sweep also
deletes the rows deleted while nothing was captured. The targets' rows stay (they are
repaired in place) unless the log's positions went back (a new server): then every
target row would look newer than the new log's events, so the reset asks to drop them.
"""
from __future__ import annotations

import logging

from .config import Config
from .errors import ConfigError, DBLogError
from .positions import Position
from .requests import DumpSpec, validate_spec
from .state import RedisState
from .store import EventStore
from .wiring import Wiring

log = logging.getLogger(__name__)

RESET_HINT = ("Recover with `dblog --config CONFIG reset --source {source} --confirm {source}`: it clears the "
              "source's Redis state, event store and the targets' applied positions and requests a full dump of "
              "every table (its orphan sweep deletes what was deleted meanwhile); then run the tail, the dump "
              "and the apply")


def earlier_history(state: RedisState, store: EventStore) -> list[str]:
    """Evidence that the source was captured before (for a tail that finds no checkpoint)."""
    out = []
    positions = store.file_positions()
    if positions:
        out.append(f"its event store at {store.uri_root} holds {len(positions)} segment file(s) up to position "
                   f"{max(positions)}")
    flushes = state.counters().get("flushes", 0)
    if flushes:
        out.append(f"Redis still counts {flushes} flushes of its tail")
    return out


def state_lost_message(source: str, evidence: list[str]) -> str:
    return (f"source {source!r} has no tail checkpoint in Redis, but {'; '.join(evidence)}: its Redis state was "
            "lost (flushed, evicted, restored from an old snapshot, a new instance). Starting at the log head "
            "would silently skip every change since the last checkpoint. " + RESET_HINT.format(source=source))


def log_gap_message(source: str, checkpoint: Position, gap: str) -> str:
    return (f"source {source!r}: the tail cannot resume at its checkpoint {checkpoint}: {gap}. The changes "
            "in between are gone from the log. " + RESET_HINT.format(source=source))


def reset_source(config: Config, source: str | None, confirm: str, drop_targets: bool = False,
                 dump: bool = True) -> dict:
    """Start the source's capture again from the log head, and repair the targets with a
    full dump. ``confirm`` must repeat the source's name. Refused while a tail or a dump
    runner of the source is live."""
    parts = Wiring(config, source)
    name, state, store = parts.name, parts.state, parts.store
    if confirm != name:
        raise ConfigError(f"reset forgets everything captured of source {name!r}: repeat its name to confirm "
                          f"(--confirm {name})")
    holder = state.lease_holder()
    if holder:
        raise DBLogError(f"a tail of {name!r} is running ({holder}; its lease expires in "
                         f"{state.lease_expires_in() or 0:.0f}s): stop it before the reset")
    busy = [w.request for w in state.open_windows() if state.lease_holder(w.request)]
    if busy:
        raise DBLogError(f"dump request(s) {', '.join(sorted(set(busy)))} of {name!r} are running: cancel them "
                         "first (dblog cancel ID)")
    from .targets import open_target
    targets = [t for t in config.targets.values() if t.source == name]
    with parts.opened_source() as src:
        head, _ = src.current_resume()
        ahead = {}
        for tcfg in targets:
            with open_target(tcfg) as target:
                for table in parts.source_config.tables:
                    pos = target.applied_pos(name, table)
                    if pos is not None and head < pos:
                        ahead[f"{tcfg.name}:{table}"] = pos.encode()
        if ahead and not drop_targets:
            raise DBLogError(
                f"the log of {name!r} is at {head}, before positions the targets have applied "
                f"({', '.join(f'{k} at {v}' for k, v in sorted(ahead.items())[:5])}): a new server, or one "
                "restored from a backup. A re-dump could not overwrite rows that look newer than its events: "
                "reset with --drop-targets (the targets' tables of this source are dropped and rebuilt by the dump)")
        spec = validate_spec(src, DumpSpec("all", list(parts.source_config.tables)), config.dump) if dump else None
    out = {"source": name, "log_head": head.encode(), "targets": {}, "store_removed": [], "dump_request": None}
    for tcfg in targets:
        with open_target(tcfg) as target:
            if drop_targets:
                out["targets"][tcfg.name] = {"dropped": target.drop_all()}
            else:
                for table in parts.source_config.tables:
                    target.reset_applied(name, table)
                out["targets"][tcfg.name] = {"positions_reset": list(parts.source_config.tables)}
    out["store_removed"] = store.remove_source()
    state.reset()
    if spec is not None:
        out["dump_request"] = state.create_request(spec.to_dict())
    log.warning("source %s reset: capture starts again at the log head (%s)%s", name, head,
                f"; full dump request {out['dump_request']} created" if out["dump_request"] else "")
    return out
