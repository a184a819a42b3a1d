"""One table's schema change is one table's trouble (DESIGN invariant 8).

A change its targets cannot follow (engine/schema_evolution.py: the key changed, a type
narrowed, a column added with a value no row event carries, ...) or a statement that
changed its rows without row events (TRUNCATE, DROP TABLE) quarantines that table only:

- the tail records the new shape as a version from the change (marked ``quarantined``),
  records the quarantine in Redis, and goes on: the table's events are still stored, in
  the new shape, and every other table keeps flowing;
- an apply stops the table's batch before the change (``status: quarantined``, with why
  and the fix); ``dblog status`` lists it;
- a full dump of the table requested after the change (one click in the repair form, or
  ``dblog dump --table``) releases it: once that dump has finished the table, the next
  apply rebuilds the target table in the new shape, empty, with its checkpoint at the
  change, and applies from there: the log's events after the change, then the dump's
  snapshot, which holds every row (a row deleted before the dump is simply not there).

Redis: ``<prefix>:<source>:quarantined``, a hash {table: {"at": where its targets stop,
"why", "since": when a releasing dump may be requested from, "last": its latest break}}.
Nothing here imports Airflow.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from .positions import Position

log = logging.getLogger(__name__)

KEY = "quarantined"


def fix_for(table: str) -> str:
    return (f"re-dump {table}: a full dump of the table (`dblog dump --table {table}`, or the repair form "
            "with the table and scope 'table'); once it has finished, the next apply rebuilds the target "
            "table in the new shape")


def quarantine_table(state, table: str, at: Position, why: str) -> None:
    """Record that ``table``'s targets stop before ``at`` until the table is re-dumped. A
    table already quarantined keeps its first position (where its targets stop), but a new
    break later in the log (not the replay of one) needs a dump requested after it."""
    key, now = state.k(KEY), time.time()
    entry = {"at": at.encode(), "why": why, "since": now, "last": at.encode()}
    if state.r.hsetnx(key, table, json.dumps(entry)):
        log.error("%s quarantined at %s: %s. Its events are still captured; its targets stop before the "
                  "change until it is re-dumped: %s", table, at, why, fix_for(table))
        return
    old = json.loads(state.r.hget(key, table) or "{}")
    if old and at.encode() > old.get("last", old["at"]):
        state.r.hset(key, table, json.dumps(old | {"why": f"{old['why']}; then {why}", "since": now,
                                                   "last": at.encode()}))
        log.error("%s, quarantined since %s, broke again at %s: %s", table, old["at"], at, why)


def quarantined(state) -> dict[str, dict]:
    """{table: {"at", "why", "since", "fix"}} of the source's quarantined tables."""
    return {t: json.loads(v) | {"fix": fix_for(t)} for t, v in state.r.hgetall(state.k(KEY)).items()}


def releasing_dump(state, table: str, entry: dict, look_back: int = 200) -> str | None:
    """A full dump of ``table`` requested after its quarantine began that has finished the
    table, or None."""
    for rid in state.requests(look_back):
        req = state.request(rid)
        if req is None or float(req.get("created_at", 0)) < entry["since"]:
            continue
        spec = req["spec"]
        if spec["scope"] in ("all", "table") and table in spec["tables"] and state.progress(rid, table).get("done"):
            return rid
    return None


def release(state, table: str) -> None:
    state.r.hdel(state.k(KEY), table)


def settle(target, state, source_name: str, table: str, shape_at: Callable[[Position], object]) -> dict | None:
    """The quarantine of ``table`` as an apply meets it: None when it has none. Its
    releasing dump done: the target table rebuilt empty in ``shape_at(at)`` (the shape
    holding from the change) with its checkpoint at the change, the quarantine lifted,
    None. Else the entry: the batch stops at its ``at``."""
    entry = quarantined(state).get(table)
    if entry is None:
        return None
    rid = releasing_dump(state, table, entry)
    if rid is None:
        return entry
    at = Position.decode(entry["at"])
    schema = shape_at(at)
    # each step is safe to redo: until the quarantine is lifted, the next apply starts over
    target.drop_table(schema)
    target.ensure_table(schema)
    target.reset_applied(source_name, schema)
    target.advance_applied(source_name, schema, at)
    release(state, table)
    log.warning("%s released from quarantine by dump request %s: target table rebuilt in the new shape, "
                "applied from %s", table, rid, at)
    return None
