"""``dblog verify`` (issue 29): a target compared with its source while both keep changing,
and, asked to, repaired where it differs.

1. The verification is a dump request with ``verify: <target>`` (requests.DumpSpec): its
   chunks run Algorithm 1 exactly as a dump's (windows, the same chunk plan, in this
   process or on Spark), but each reconciled chunk is kept for the comparison
   (store.write_verified), not written to the log; it sweeps nothing and releases no
   quarantine.
2. Per table, once the target's applied position is past every chunk's HW, one consistent
   read of the target (``Target.read_at``) is compared with the chunks, leaving out the
   keys the log changed meanwhile (verify_compare.py: the window argument).
3. ``repair``: a key-list dump of exactly the keys that differ (a key the source lacks is
   deleted by it), applied to the target, then those keys verified again.

Each table's last result is kept in Redis for ``dblog status``. No Airflow here.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Callable

from .config import Config
from .errors import NoPrimaryKeyError, TargetShapeError, UnknownTableError, VerificationError
from .local_chunks import LocalChunkReader
from .positions import Position
from .quarantine import quarantined
from .requests import DumpSpec, validate_spec
from .schema import TableSchema
from .schema_evolution import IGNORE
from .targets import name_clashes, open_target
from .verify_compare import TableReport, compare_table, key_strings, last_changes
from .wiring import Wiring

log = logging.getLogger(__name__)

VERIFIED = "verified"   # Redis hash: "<table>|<target>" -> the last verification's summary
RESHAPED_ATTEMPTS = 3   # verifications of a table that keeps changing shape meanwhile before "not verified"
SHOWN_IN_STATUS = 20
POLL_FIRST_S, POLL_MAX_S = 0.05, 2.0   # the wait for the target's apply to pass the HW: polls growing 1.5x


def run_verify(config: Config, target_name: str, spec: DumpSpec, *, repair: bool = False, via: str = "local",
               wait_s: float = 600.0, run_spark: Callable[[str], dict] | None = None) -> dict:
    """Verify ``spec``'s tables (scope all / table / keys / where) on the target; with
    ``repair``, dump, apply and verify again the keys that differ. ``via``: the chunks read
    in this process ("local") or by ``run_spark(request_id)`` (the dump job on Spark).
    Returns ``{"request", "target", "equal", "tables": {table: report}}`` (and "repair")."""
    tcfg = config.target(target_name)
    parts = Wiring.of_target(config, target_name)
    out = _verify(config, parts, tcfg.name, spec, via, wait_s, run_spark)
    for attempt in range(2, RESHAPED_ATTEMPTS + 1):   # a table that changed shape meanwhile: again
        for t in [t for t, rep in out["reports"].items() if rep.incomplete]:
            log.info("verification %s: %s changed shape meanwhile: verified again", out["request"], t)
            one = spec if spec.scope != "all" else DumpSpec("table", [t], [], spec.chunk_size, spec.parallelism)
            try:
                rep = _verify(config, parts, tcfg.name, one, via, wait_s, run_spark)["reports"][t]
            except VerificationError as e:   # held for good by the change meanwhile: this table's report
                rep = TableReport(t, tcfg.name, error=str(e))
                _record(parts.state, rep, out["request"])
            rep.attempts = attempt
            out["reports"][t] = rep
    out["equal"] = all(rep.equal for rep in out["reports"].values())
    if repair and not out["equal"]:
        out["repair"] = {t: _repair_or_why(config, parts, tcfg.name, t, rep, wait_s, out["request"])
                         for t, rep in out["reports"].items() if rep.differing_keys()}
        out["repaired"] = (all(r["equal"] for r in out["repair"].values())
                           and not any(rep.incomplete or rep.error for rep in out["reports"].values()))
    out["tables"] = {t: rep.to_dict() for t, rep in out.pop("reports").items()}
    return out


def _verify(config: Config, parts: Wiring, target: str, spec: DumpSpec, via: str, wait_s: float,
            run_spark: Callable[[str], dict] | None) -> dict:
    state, store = parts.state, parts.store
    with parts.opened_source() as source:
        tables = spec.tables
        if spec.scope == "all":   # a table gone or keyless at the source is its own report, not the run's end
            tables = list(source.tables)
            unverifiable = _unreadable_at_source(source, tables)
            tables = [t for t in tables if t not in unverifiable]
            if not tables:
                raise VerificationError("; ".join(unverifiable.values()))
        else:
            unverifiable = {}
        spec = validate_spec(source, DumpSpec(spec.scope, tables, spec.keys, spec.chunk_size, spec.parallelism,
                                              spec.where, verify=target), config.dump)
        unverifiable |= _held_for_good(config, source, target, spec.tables)
        if all(t in unverifiable for t in spec.tables):
            raise VerificationError("; ".join(unverifiable.values()))
        spec = DumpSpec(spec.scope, [t for t in spec.tables if t not in unverifiable], spec.keys, spec.chunk_size,
                        spec.parallelism, spec.where, verify=target)
        rid = state.create_request(spec.to_dict())
        log.info("verification %s of %s on target %s: %s", rid, ", ".join(spec.tables), target, spec.scope)
        try:
            if via == "local":
                parts.runner(LocalChunkReader(source), source=source).run(rid)
            else:
                run_spark(rid)
            gone = _unreadable_at_source(source, spec.tables)   # dropped, renamed, keyless since the chunks
            schemas = {t: source.table_schema(t) for t in spec.tables if t not in gone}
        except BaseException:
            store.remove_verified(rid)
            raise
    reports = {t: TableReport(t, target, error=why) for t, why in (unverifiable | gone).items()}
    for report in reports.values():
        _record(state, report, rid)
    try:
        with open_target(config.target(target)) as tgt:
            for name, schema in schemas.items():
                scope = set(key_strings(schema, [schema.parse_key(k) for k in spec.keys])) if spec.by_keys else None
                try:   # one table's failure is its own report: the other tables still get theirs
                    reports[name] = _compare(parts, tgt, rid, schema, scope, wait_s)
                except VerificationError as e:   # held, quarantined, not applied: saying why
                    reports[name] = TableReport(name, target, error=str(e))
                except Exception as e:
                    log.exception("verification %s of %s on target %s failed", rid, name, target)
                    reports[name] = TableReport(name, target, error=f"{type(e).__name__}: {e}")
                _record(state, reports[name], rid)
                log.info("verification %s: %s", rid, reports[name].describe())
    finally:
        store.remove_verified(rid)
    return {"request": rid, "target": target, "equal": all(r.equal for r in reports.values()), "reports": reports}


def _unreadable_at_source(source, tables: list[str]) -> dict[str, str]:
    """The tables the source cannot give a schema with a key for (dropped, renamed, keyless): why, per table."""
    why = {}
    for t in tables:
        try:
            source.table_schema(t)
        except (UnknownTableError, NoPrimaryKeyError) as e:
            why[t] = f"{t} cannot be verified: {e}"
    return why


def _held_for_good(config: Config, source, target: str, tables: list[str]) -> dict[str, str]:
    """The tables the target's apply holds whatever comes (a shape it cannot hold, a target
    name another table has too): why, per table. Their verification would wait for nothing."""
    tcfg = config.target(target)
    clashes = name_clashes(source.tables, getattr(tcfg, "changelog", False), target)
    held = {t: f"{t} is held on target {target} for good: {clashes[t]['held']['error']}"
            for t in tables if t in clashes}
    with open_target(tcfg) as tgt:
        for t in [t for t in tables if t not in held]:
            try:
                tgt.check_table(source.table_schema(t))
            except TargetShapeError as e:
                held[t] = f"{t} is held on target {target} for good: {e}"
    return held


def _compare(parts: Wiring, target, rid: str, schema: TableSchema, scope: set[str] | None,
             wait_s: float) -> TableReport:
    chunks = parts.store.read_verified(rid, schema)
    progress = parts.state.progress(rid, schema.qualified)
    lws = [lw for lw, _, _ in chunks]
    floor = Position.decode(progress["head_before"]) if progress.get("head_before") else min(lws, default=None)
    if floor is None:   # no chunk was read: nothing to compare
        return TableReport(schema.qualified, target.config.name)
    need = max([hw for _, hw, _ in chunks], default=floor)
    deadline = time.monotonic() + wait_s
    while True:
        at, rows = _read_past(parts, target, schema, need, deadline, wait_s)
        try:   # (rows a comparison does not read hold the target's read open: closed at once)
            report = _compare_at(parts, target, schema, chunks, floor, at, rows, scope)
        finally:
            _close(rows)
        if not report.ahead:
            report.not_carried = [c.name for c in schema.columns if c not in _carried(parts, target, schema).columns]
            return report
        if time.monotonic() > deadline:   # (a lake batch ending at a change of shape commits twice)
            raise VerificationError(f"{schema.qualified}: target {target.config.name} kept rows past its applied "
                                    f"position {at} for {wait_s:.0f} s: an apply stopped between two commits?")
        time.sleep(0.2)


def _compare_at(parts: Wiring, target, schema: TableSchema, chunks, floor: Position, at: Position, rows,
                scope: set[str] | None) -> TableReport:
    """The chunks compared with the target's rows read at its applied position ``at``."""
    # a change of shape or a TRUNCATE meanwhile (a schema version, not a row event): every key read before
    # it is out. At ``at`` itself too: a target at a change's position has taken it (its applied position
    # moves to the change with the new shape, in one transaction or, on a lake, one commit after the rows)
    reshaped = _reshaped(parts.store.schema_versions(schema.qualified), floor, at)
    if reshaped is not None:
        read = sum(c[2].num_rows for c in chunks)
        return TableReport(schema.qualified, target.config.name, at.encode(), source_rows=read, skipped=read,
                           incomplete=f"the table changed shape (or was emptied) at {reshaped} during the "
                                      "verification: every key read before it is left out; verify it again")
    # a lake batch that ends at a change of shape commits its rows, then the position with the
    # change: the rows read may be the table just below that change, so keys changed up to it are out
    upto = min((p for p, _ in parts.store.schema_versions(schema.qualified) if p > at), default=at)
    changes = last_changes(schema, parts.store.read_range(schema, floor, upto))
    return compare_table(_carried(parts, target, schema), target.config.name, chunks, rows, at, changes, floor,
                         scope, upto)


def _carried(parts: Wiring, target, schema: TableSchema) -> TableSchema:
    """The shape the target holds of the table: the source's, less the columns a table whose
    schema changes are ``ignore``d never carried (added, or renamed to, after its first
    apply). Any other table is compared in the source's whole shape (a column its target
    lacks: a change of shape meanwhile, verified again, or a target altered by hand)."""
    if parts.source_config.schema_changes_for(schema.qualified) != IGNORE:
        return schema
    have = set(target.columns(schema))
    if not have:
        return schema
    return replace(schema, columns=tuple(c for c in schema.columns if c.name in have))


def _close(rows) -> None:
    """Ends a target's read (Target.read_at's rows may hold a transaction open until closed)."""
    close = getattr(rows, "close", None)
    if close is not None:
        close()


def _reshaped(versions: list[tuple[Position, dict]], floor: Position, at: Position) -> Position | None:
    """The last version in (floor, at] that changed the table's columns, emptied it or renamed
    it. A version of the same columns (an index, a comment: a MariaDB ALTER the log records)
    changes no row's values: the comparison holds across it."""
    found, before = None, None
    for p, v in versions:
        if floor < p <= at and (before is None or v.get("schema") != before.get("schema") or v.get("truncated")
                                or v.get("renamed")):
            found = p
        before = v
    return found


def _read_past(parts: Wiring, target, schema: TableSchema, need: Position, deadline: float,
               wait_s: float) -> tuple[Position, object]:
    """The target's rows and applied position once it is at or past ``need``; a table
    quarantined or held on it fails at once, saying why (it would not get there)."""
    from .apply_plan import held_tables
    checked, pause = 0.0, POLL_FIRST_S
    while True:
        at = target.applied_pos(parts.name, schema)
        if at is not None and at >= need:   # then the rows and the position of one read
            at, rows = target.read_at(_carried(parts, target, schema), parts.name)
            if at is not None and at >= need:
                return at, rows
            _close(rows)
        stopped = quarantined(parts.state).get(schema.qualified) or {}
        if target.config.name in stopped.get("waiting", []):   # its apply stops before a change of shape
            raise VerificationError(f"{schema.qualified} is quarantined on target {target.config.name} "
                                    f"({stopped.get('why')}): it stays at {at}; {stopped.get('fix')}, then verify")
        if time.monotonic() - checked > 5:
            checked = time.monotonic()
            held = held_tables(target, parts.store, parts.state, parts.name, [schema.qualified])
            if schema.qualified in held:
                h = held[schema.qualified]
                raise VerificationError(f"{schema.qualified} is held on target {target.config.name} at {h['at']} "
                                        f"({h['error']}): it stays at {at}; fix the value at the source, then verify")
        if time.monotonic() > deadline:
            raise VerificationError(
                f"{schema.qualified}: target {target.config.name} has applied up to {at} and the verification "
                f"needs {need} (its last chunk's HW) after {wait_s:.0f} s: is its apply running?")
        time.sleep(pause)   # an apply running beside it passes the HW soon; one run by a schedule, later
        pause = min(pause * 1.5, POLL_MAX_S)


def _repair_or_why(config: Config, parts: Wiring, target: str, table: str, report: TableReport,
                   wait_s: float, rid: str) -> dict:
    """``_repair``, or why it failed: one table's repair that cannot be made (its dump or
    apply fails) is that table's result, and the other tables are still repaired."""
    try:
        return _repair(config, parts, target, table, report, wait_s)
    except Exception as e:   # noqa: BLE001 - reported with the table, the run goes on
        log.exception("repair of %s on target %s failed", table, target)
        why = f"{type(e).__name__}: {e}"
        _record(parts.state, report, rid, repair_error=why)
        return {"keys": len(report.differing_keys()), "equal": False, "error": why}


def _repair(config: Config, parts: Wiring, target: str, table: str, report: TableReport, wait_s: float) -> dict:
    """A key-list dump of the keys that differ, its apply to the target, and those keys verified again."""
    from .apply import run_apply
    keys = report.differing_keys()
    with parts.opened_source() as source:
        spec = validate_spec(source, DumpSpec("keys", [table], keys), config.dump)
        rid = parts.state.create_request(spec.to_dict())
        parts.runner(LocalChunkReader(source), source=source).run(rid)
    applied = run_apply(config, target, [table], via="local")
    again = _verify(config, parts, target, DumpSpec("keys", [table], keys), "local", wait_s, None)
    rep = again["reports"][table]
    log.warning("verification of %s on %s: %d key(s) repaired by dump request %s: %s", table, target, len(keys),
                rid, "now equal" if rep.equal else rep.describe())
    _record(parts.state, rep, again["request"], repaired_by=rid)
    return {"request": rid, "keys": len(keys), "apply": applied.get("tables", {}).get(table, applied),
            "verify": again["request"], "equal": rep.equal, "report": rep.to_dict()}


def _record(state, report: TableReport, rid: str, repaired_by: str | None = None,
            repair_error: str | None = None) -> None:
    summary = {k: v for k, v in report.to_dict().items() if k != "keys"} | {
        "request": rid, "when": time.time(), "repaired_by": repaired_by,
        **({"repair_error": repair_error} if repair_error else {}),
        "keys": {kind: keys[:SHOWN_IN_STATUS] for kind, keys in report.keys.items()}}
    state.r.hset(state.k(VERIFIED), f"{report.table}|{report.target}", json.dumps(summary, default=str))


def last_verifications(state) -> dict[str, dict]:
    """``{"<table>|<target>": summary}`` of each table's last verification (``dblog status``)."""
    return {k: json.loads(v) for k, v in state.r.hgetall(state.k(VERIFIED)).items()}
