"""One table's schema change is one table's trouble (DESIGN invariant 8).

A change its targets cannot follow (engine/schema_evolution.py: the key changed, a type
narrowed, a column added with a value no row event carries, ...) or a statement that
changed its rows without row events (TRUNCATE, DROP TABLE) quarantines that table only:

- the tail records the new shape as a version from the change (marked ``quarantined``),
  records the break in Redis, and goes on: the table's events are still stored, in the
  new shape, and every other table keeps flowing;
- each target's apply stops the table's batch before the first break that target has not
  been rebuilt past (``status: quarantined``, with why and the fix); ``dblog status``
  lists the table while a target known to the source still waits;
- a full dump of the table that read it after its latest break (one click in the repair
  form, or ``dblog dump --table``) releases it, target by target: once that dump has
  finished the table, the next apply of each target rebuilds the target table empty in
  the shape holding at the latest break, with its checkpoint there, and applies from
  there: the log's events after the break, then the dump's snapshot, which holds every row
  (a row deleted before the dump is simply not there). A break after that rebuild stops
  that target again (a new dump, after it, releases it). A target that keeps a changelog
  gets a ``rebuild`` row there (targets/changelog.py), just below the latest break.

Which dump releases, by positions, never by clocks: a full dump (scope ``table`` or
``all``) releases breaks up to ``P`` when it has finished the table and the log head it
read before its first read of the table (``head_before`` of its progress: before the max
key read and every chunk's select) is past ``P``. Everything up to ``P`` was then in the
log before the dump read a row, so every row it read holds the break. (A PostgreSQL DDL
holds its lock until it is visible, so the gap between its commit record and its
visibility cannot reach a read of the table.) A dump that began reading before a break
releases nothing of it, however late it was requested or finished.

Redis, per source: ``quarantined``, a hash {table: {"at": the first break, "why",
"since": when it was recorded (shown only), "last": the latest break, "breaks": every
break in log order}}, kept as the table's break history (a target reset, or new, meets
them too); ``quarantine_rebuilt`` {"table|target": {"at": the break it was rebuilt at,
"request"}}; ``apply_targets``, the targets that applied the source, which
:func:`quarantined` waits for. Nothing here imports Airflow.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from .errors import TargetShapeError
from .positions import Position
from .schema_evolution import IGNORE
from .schema_history import version_at
from .targets.base import REBUILD, append_marked

log = logging.getLogger(__name__)

KEY, REBUILT, TARGETS = "quarantined", "quarantine_rebuilt", "apply_targets"


def fix_for(table: str) -> str:
    return (f"re-dump {table}: a full dump of the table (`dblog dump --table {table}`, or the repair form "
            "with the table and scope 'table'), started after its latest break; once it has finished, the "
            "next apply rebuilds the target table in the new shape")


def breaks(entry: dict) -> list[Position]:
    """The table's breaks in log order (an entry recorded before ``breaks`` has two)."""
    raw = entry.get("breaks") or sorted({entry["at"], entry.get("last", entry["at"])})
    return [Position.decode(p) for p in raw]


def quarantine_table(state, table: str, at: Position, why: str) -> None:
    """Record that ``table`` broke at ``at``: its targets stop before it until they are
    rebuilt past it. A break at or before the latest recorded one is a replay: ignored."""
    key, now = state.k(KEY), time.time()
    entry = {"at": at.encode(), "why": why, "since": now, "last": at.encode(), "breaks": [at.encode()]}
    if state.r.hsetnx(key, table, json.dumps(entry)):
        log.error("%s quarantined at %s: %s. Its events are still captured; its targets stop before the "
                  "change until it is re-dumped: %s", table, at, why, fix_for(table))
        return
    old = json.loads(state.r.hget(key, table) or "{}")
    if old and at > breaks(old)[-1]:
        state.r.hset(key, table, json.dumps(old | {
            "why": f"{old['why']}; then {why}", "since": now, "last": at.encode(),
            "breaks": [p.encode() for p in breaks(old)] + [at.encode()]}))
        log.error("%s, quarantined since %s, broke again at %s: %s", table, old["at"], at, why)


def quarantined_names(state) -> set[str]:
    """The tables with a quarantine record (each target's apply meets it: :func:`settle`)."""
    return set(state.r.hkeys(state.k(KEY)))


def rebuilt_at(state, table: str, target: str) -> Position | None:
    """The break ``target``'s table was last rebuilt at, or None."""
    v = state.r.hget(state.k(REBUILT), f"{table}|{target}")
    return Position.decode(json.loads(v)["at"]) if v else None


def quarantined(state) -> dict[str, dict]:
    """{table: {"at", "why", "last", "fix", "waiting": [targets]}} of the tables a target
    that applied the source has not been rebuilt past yet (``dblog status``)."""
    targets = sorted(state.r.smembers(state.k(TARGETS)))
    out = {}
    for t, v in state.r.hgetall(state.k(KEY)).items():
        entry = json.loads(v)
        last = breaks(entry)[-1]
        waiting = [n for n in targets if (rebuilt_at(state, t, n) or Position(0, 0)) < last]
        if waiting or not targets:
            out[t] = entry | {"fix": fix_for(t), "waiting": waiting}
    return out


def releasing_dump(state, table: str, after: Position, look_back: int = 200) -> str | None:
    """A full dump of ``table`` that has finished the table and began reading it after
    ``after`` in the log (see the module's docstring), or None."""
    for rid in state.requests(look_back):
        req = state.request(rid)
        if req is None:
            continue
        spec = req["spec"]
        if spec["scope"] not in ("all", "table") or table not in spec["tables"] or spec.get("verify"):
            continue
        progress = state.progress(rid, table)
        if progress.get("done") and progress.get("head_before") and Position.decode(progress["head_before"]) > after:
            return rid
    return None


def settle(target, state, source_name: str, table: str, versions: list,
           shape_at: Callable[[Position | None], object]) -> dict | None:
    """The quarantine of ``table`` as this target's apply meets it: None when the target
    has been rebuilt past every break. A releasing dump done: the target table rebuilt
    empty in ``shape_at(last)`` (the shape holding at the latest break; if this target
    cannot hold that shape, the first later one it can: :func:`holdable_from`) with its
    checkpoint there, recorded for this target only, None. Else the entry, with ``at`` the
    first break this target has not been rebuilt past: the batch stops there (with
    ``releasing``, the dump that releases it once a target keeping a changelog has applied
    up to there)."""
    name = target.config.name
    state.r.sadd(state.k(TARGETS), name)
    raw = state.r.hget(state.k(KEY), table)
    if raw is None:
        return None
    entry = json.loads(raw) | {"fix": fix_for(table)}
    rebuilt, all_breaks = rebuilt_at(state, table, name), breaks(entry)
    if rebuilt is not None:
        applied = target.applied_pos(source_name, table)
        if applied is None or applied < rebuilt or not target.exists(table):
            rebuilt = None   # the target table was reset or dropped since: the breaks hold again
    pending = [b for b in all_breaks if rebuilt is None or b > rebuilt]
    if not pending:
        return None
    last = all_breaks[-1]
    at = holdable_from(target, versions, shape_at, last)
    rid = None if at is None else releasing_dump(state, table, at)
    if rid is None:
        why = refusal(target, shape_at(last))   # the lake cannot hold the new shape: that comes first
        return entry | {"at": pending[0].encode()} | ({"fix": f"{why}; then {entry['fix']}"} if why else {})
    applied = target.applied_pos(source_name, table)
    if getattr(target.config, "changelog", False) and applied is not None and applied < pending[0]:
        # its changelog takes the events up to the break first (this batch); the same run then
        # comes back here and rebuilds (apply_run.apply_tables: "releasing")
        return entry | {"at": pending[0].encode(), "releasing": rid}
    rebuild(target, source_name, shape_at(at), at)
    state.r.hset(state.k(REBUILT), f"{table}|{name}", json.dumps({"at": at.encode(), "request": rid,
                                                                  "when": time.time()}))
    log.warning("%s released from quarantine on target %s by dump request %s: target table rebuilt in the "
                "shape of %s, applied from there", table, name, rid,
                "its latest break" if at == last else f"{at}, the first after its latest break it can hold")
    return None


def refusal(target, schema, names: list[str] | None = None) -> str:
    """Why ``target`` cannot hold a table of ``schema``'s shape (its ``check_table``; in the
    columns ``names`` if given), or ""."""
    try:
        target.check_table(schema, names)
        return ""
    except TargetShapeError as e:
        return str(e)


def holdable_from(target, versions: list, shape_at: Callable, at: Position | None) -> Position | None:
    """``at``, or the first version after it, whose shape ``target`` can hold; None if none."""
    for p in [at] + [v for v, _ in versions if at is not None and v > at]:
        if not refusal(target, shape_at(p)):
            return p
    return None


def rebuild(target, source_name: str, schema, at: Position) -> None:
    """The target table emptied in ``schema`` with its checkpoint at ``at`` (a done dump
    read after ``at`` brings every row back). Each step is safe to redo, and the checkpoint
    moves last: until it is at ``at`` (and the caller has recorded the rebuild), the next
    apply starts over. A shape the target refuses leaves the table as it is."""
    target.check_table(schema)
    target.drop_table(schema)
    target.ensure_table(schema)
    target.reset_applied(source_name, schema)
    # the emptying, in the changelog (if kept) just below ``at``: replayed like a truncate,
    # every row before it gone; the events from ``at`` on follow it (once: append_marked)
    append_marked(target, schema, source_name, REBUILD, at.just_below())
    target.advance_applied(source_name, schema, at)


def release_refused_shape(target, state, source_name: str, table: str, versions: list, shape_at: Callable,
                          applied: Position | None, frontier: Position) -> Position | None:
    """A shape this target cannot hold (``check_table``: two columns alike but for case in a
    lake table, ...) holds the table there, from its checkpoint or from a change after it.
    The fix is at the source (a rename): a later shape the target accepts, at ``fix``. A
    full dump that read the table after ``fix`` (:func:`releasing_dump`) then releases it:
    the target table rebuilt empty in that shape with its checkpoint at ``fix``; the log's
    events from there and the dump's snapshot, which holds every row, follow. Returns
    ``fix`` when it rebuilt, else None (the apply meets the refusal and holds, naming it)."""
    if not versions:
        return None
    have: list = []   # the target's columns, read once and only for an ``ignore`` version (none on most applies)

    def refused(at: Position | None) -> str:   # (under ``ignore``, in the columns the target has)
        version = (version_at(versions, at) if at is not None else versions[0][1]) or {}
        if version.get("behaviour") == IGNORE and not have:
            have.append(target.columns(table) if target.exists(table) else None)
        names = have[0] if version.get("behaviour") == IGNORE else None
        return refusal(target, shape_at(at), names)
    later = [at for at, _ in versions if (applied is None or at > applied) and at <= frontier]
    bad = next((at for at in [applied] + later if refused(at)), False)
    if bad is False:
        return None
    fix = next((at for at in later if (bad is None or at > bad) and not refused(at)), None)
    rid = None if fix is None else releasing_dump(state, table, fix)
    if rid is None:
        return None
    rebuild(target, source_name, shape_at(fix), fix)
    log.warning("%s released on target %s by dump request %s: its shape from %s is one the target holds; "
                "target table rebuilt in it, applied from there", table, target.config.name, rid, fix)
    return fix
