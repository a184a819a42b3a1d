"""Dump requests: what a user asks to dump (``DumpSpec``), its validation against the source,
and the request's controls (pause, resume, cancel) with the one set of rules every front end
(the ``dblog`` command, the Airflow operators and forms) applies."""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from .config import DumpConfig
from .errors import ConfigError, DumpCancelledError, InvalidKeyError
from .keys import encode_scalar
from .sources.base import Source
from .state import RedisState

SCOPES = ("all", "table", "keys", "where")
MAX_KEYS = 1_000_000


@dataclass
class DumpSpec:
    """What a user asked to dump. Validated before anything touches the source."""
    scope: str  # all | table | keys | where
    tables: list[str]
    keys: list[list] = field(default_factory=list)
    chunk_size: int | None = None
    parallelism: int | None = None
    where: str | None = None  # scope "where": resolved to a key list when submitted
    # a verification against this target (engine/verify_run.py): the chunks' rows are kept
    # for the comparison, not written as snapshot events; no orphan sweep, no quarantine release
    verify: str | None = None

    def to_dict(self) -> dict:
        return {"scope": self.scope, "tables": self.tables, "keys": self.keys, "chunk_size": self.chunk_size,
                "parallelism": self.parallelism, "where": self.where} | ({"verify": self.verify} if self.verify else {})

    @classmethod
    def from_dict(cls, d: dict) -> "DumpSpec":
        return cls(d["scope"], list(d["tables"]), list(d.get("keys") or []),
                   d.get("chunk_size"), d.get("parallelism"), d.get("where"), d.get("verify"))

    @property
    def by_keys(self) -> bool:
        """Key-list and WHERE dumps read rows by key with bound parameters."""
        return self.scope in ("keys", "where")


# -- one parser for every front end (the dblog command, the repair form, the operators) ------
def blank(value: Any) -> bool:
    """No value: None, empty, or what a template renders for one (``{{ params.x }}`` of None)."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


def parse_int(value: Any, name: str) -> int | None:
    """An integer, or its text; None when blank."""
    if blank(value):
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{name} must be an integer, not {value!r}")


def parse_keys(value: Any) -> list:
    """A key list in any of the syntaxes the front ends take, all of them everywhere: a list;
    its JSON text (``[1, 2]``, ``[[1, "a"], [2, "b"]]`` for composite keys) or Python text (a
    list param a template rendered: ``[[1, 'a']]``); or one key per line, a composite key's
    values comma-separated in key order (``1001, 2``). Typed against the key later
    (``validate_spec``)."""
    if blank(value):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    raise InvalidKeyError(f"the keys are not a valid JSON list ({e.msg}, line {e.lineno}): "
                                          'write [1, 2] or [[1, "a"], [2, "b"]], or one key per line') from None
        else:
            keys = []
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                values = [v.strip() for v in line.split(",")]
                if any(v == "" for v in values):
                    raise InvalidKeyError(f"line {n} of the keys has an empty value: {line!r}")
                keys.append(values)
            return keys
    if not isinstance(value, (list, tuple)):
        raise InvalidKeyError(f"the keys must be a list of primary keys, not {type(value).__name__}")
    return list(value)


def parse_spec(scope: Any, table: Any = None, keys: Any = None, where: Any = None,
               chunk_size: Any = None, parallelism: Any = None) -> DumpSpec:
    """The dump request the user's fields describe, with the same rules for every front end;
    ``validate_spec`` then checks it against the source. ConfigError says what is wrong."""
    scope = str(scope or "").strip()
    if scope not in SCOPES:
        raise ConfigError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    table = None if blank(table) else str(table).strip()
    key_list = parse_keys(keys)
    where = None if blank(where) else str(where).strip()
    if scope == "all" and table:
        raise ConfigError("scope 'all' dumps every configured table: leave the table empty")
    if scope != "all" and not table:
        raise ConfigError(f"scope {scope!r} needs a table (as db.table)")
    if scope != "keys" and key_list:
        raise ConfigError(f"keys were given but the scope is {scope!r}: choose scope 'keys' or clear them")
    if scope != "where" and where:
        raise ConfigError(f"a WHERE condition was given but the scope is {scope!r}: choose scope "
                          "'where' or clear it")
    if scope == "where" and not where:
        raise ConfigError("scope 'where' needs a condition, e.g. status = 'new'")
    return DumpSpec(scope, [table] if table else [], key_list, parse_int(chunk_size, "chunk_size"),
                    parse_int(parallelism, "parallelism"), where)


def validate_spec(source: Source, spec: DumpSpec, defaults: DumpConfig) -> DumpSpec:
    """Every field checked against the config and the table's key; errors say what is wrong."""
    if spec.scope not in SCOPES:
        raise ConfigError(f"scope must be one of {SCOPES}, not {spec.scope!r}")
    if spec.scope == "all":   # every configured table, or those of them given (a verification's remaining)
        tables = [source.config.table(t) for t in spec.tables] if spec.tables else list(source.tables)
    else:
        if len(spec.tables) != 1:
            raise ConfigError(f"scope {spec.scope!r} takes exactly one table, got {spec.tables!r}")
        tables = [source.config.table(spec.tables[0])]
    for name, value, lo, hi in (("chunk_size", spec.chunk_size, 1, 10_000_000),
                                ("parallelism", spec.parallelism, 1, 64)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi):
            raise ConfigError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    keys: list[list] = []
    if spec.scope == "keys":
        if not spec.keys:
            raise InvalidKeyError("scope 'keys' needs at least one primary key")
        if len(spec.keys) > MAX_KEYS:
            raise InvalidKeyError(f"at most {MAX_KEYS:,} keys per request; split the list")
        schema = source.table_schema(tables[0])
        parsed = source.canonical_keys(schema, [schema.parse_key(k) for k in spec.keys])
        parsed = dict.fromkeys(parsed)  # drop repeats, keep order
        keys = [[encode_scalar(v) for v in k] for k in parsed]
    elif spec.scope == "where":
        # the condition picks the keys now (a bound, read-only select); their rows are
        # then dumped like a key list, so rows deleted meanwhile are deleted in targets
        schema = source.table_schema(tables[0])
        found = source.keys_where(schema, spec.where or "", MAX_KEYS)
        if len(found) > MAX_KEYS:
            raise ConfigError(f"the condition matches more than {MAX_KEYS:,} rows; dump the table instead")
        if not found:
            raise ConfigError(f"no row of {schema.qualified} matches {spec.where!r}: nothing to dump")
        keys = [[encode_scalar(v) for v in k] for k in found]
    else:
        for t in tables:
            source.table_schema(t)  # raises for a missing table or one without a key
    return DumpSpec(spec.scope, tables, keys, spec.chunk_size or defaults.chunk_size,
                    spec.parallelism or defaults.parallelism, spec.where if spec.scope == "where" else None,
                    spec.verify)


# -- the request's controls --------------------------------------------------------
FINISHED = ("done", "cancelled")
ACTIONS = ("pause", "resume", "cancel")


class UnknownRequestError(ConfigError):
    """No dump request of that id on that source."""


def request_or_raise(state: RedisState, rid: str) -> dict:
    req = state.request(rid) if rid else None
    if req is None:
        raise UnknownRequestError(f"unknown dump request {rid!r} on source {state.source!r}")
    return req


def runnable_request(state: RedisState, rid: str) -> dict:
    """The request, if a run may start or go on with it: known and not cancelled (its status
    or its flag). A done request is runnable: its run finds nothing left and says so."""
    req = request_or_raise(state, rid)
    if req["status"] == "cancelled" or state.flag(rid, "cancel"):
        raise DumpCancelledError(f"dump request {rid} is cancelled: start a new dump instead")
    return req


def control_request(state: RedisState, rid: str, action: str) -> dict:
    """Pause, resume or cancel a request (its flags; a running dump stops at its next chunk
    boundary). A finished request (done or cancelled) cannot be paused or cancelled, and a
    cancelled one cannot be resumed: ConfigError saying so, nothing changed."""
    if action not in ACTIONS:
        raise ConfigError(f"action must be one of {ACTIONS}, not {action!r}")
    req = request_or_raise(state, rid)
    status = req["status"]
    cancelled = status == "cancelled" or state.flag(rid, "cancel")
    if action in ("pause", "cancel") and (status in FINISHED or cancelled):
        raise ConfigError(f"dump request {rid} is {'cancelled' if cancelled else status}: "
                          f"there is nothing to {action}")
    if action == "resume" and cancelled:
        raise ConfigError(f"dump request {rid} is cancelled: it cannot be resumed; start a new dump")
    if action == "resume":
        state.set_flag(rid, "pause", False)
    else:
        state.set_flag(rid, action, True)
    return {"request": rid, "action": action, "status": status,
            "pause": state.flag(rid, "pause"), "cancel": state.flag(rid, "cancel")}


def controllable_requests(state: RedisState, limit: int = 20) -> dict[str, str]:
    """The newest requests that pause, resume or cancel still apply to (not done, not
    cancelled): id → a label (status, scope, tables), newest first; for the control form."""
    out: dict[str, str] = {}
    for rid in state.requests(limit):
        req = state.request(rid)
        if req is None or req["status"] in FINISHED or state.flag(rid, "cancel"):
            continue
        spec = req["spec"]
        out[rid] = f"{rid} — {req['status']}, {spec['scope']} of {', '.join(spec['tables'])}"
    return out
