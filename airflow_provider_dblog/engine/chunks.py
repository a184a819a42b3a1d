"""A dump's chunks as plain data, and what a chunk that failed leaves behind.

:class:`ChunkTask` travels between processes (the Airflow chunk, sensor and reconcile
tasks, ``spark_jobs/chunk_select_job.py``); :func:`fail_window` closes the window of a
chunk that failed so it no longer holds the apply frontier back. The lifecycle that uses
them is engine/dump.py, which re-exports them.
"""
from __future__ import annotations

import decimal
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import DBLogError
from .keys import encode_scalar
from .state import RedisState
from .windows import Window


@dataclass
class DumpSummary:
    request: str
    tables: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    retries: int = 0  # chunks redone after the source or Redis was away

    def total(self, name: str) -> int:
        return sum(t.get(name, 0) for t in self.tables.values())


@dataclass
class ChunkTask:
    """One chunk of a request: a key range (read on Spark) or a batch of keys (bound select).
    Plain data, so the steps of a chunk can run in different processes (Airflow tasks)."""
    request: str
    table: str
    predicates: list[str] = field(default_factory=list)
    keys: list[list] | None = None  # a key batch, JSON-typed (encode_scalar)
    end: str | None = None           # encode_key of the range's last key
    last: bool = False               # completing it completes the table

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "ChunkTask":
        return cls(**d)


class ChunkOrderError(DBLogError):
    """A range dump's chunk ends at or before the previous one's end, in the key's order: its
    plan and its key comparisons disagree (the dump would loop or skip rows)."""


def _nan(v: Any) -> bool:
    return isinstance(v, float) and v != v


def advances(last: Sequence[tuple[bool, Any]], end: Sequence[tuple[bool, Any]]) -> bool | None:
    """Whether key ``end`` comes after key ``last`` (each ``Source.key_order``: (orderable,
    value) per column, compared column by column); None when the first column in which they
    differ cannot be ordered here (text: the server's collation decides)."""
    for (ok_a, a), (ok_b, b) in zip(last, end):
        try:
            if a == b or (_nan(a) and _nan(b)):
                continue
            if _nan(a) or _nan(b):   # NaN sorts after every number (PostgreSQL's order of float keys)
                return _nan(b) if ok_a and ok_b else None
            return b > a if ok_a and ok_b else None
        except (TypeError, decimal.InvalidOperation):
            return None
    return False


def check_advance(source, state: RedisState, task: ChunkTask, schema, fail: Callable[[Exception], None]) -> None:
    """ChunkOrderError (after ``fail(error)``, which closes the chunk's window) unless a range
    chunk ends past the last completed one (in the key's order, as far as it can be told
    here; an equal end always fails): a plan that goes back would loop, or move the
    progress over rows never read. Never retried."""
    if task.end is None:
        return
    last = state.progress(task.request, task.table).get("last_key")
    if not last:
        return
    # a source that cannot order its keys in Python: only an equal end is told
    order = getattr(source, "key_order", None) or (lambda s, key: [(False, v) for v in key])
    a, b = schema.decode_key(last), schema.decode_key(task.end)
    if advances(order(schema, a), order(schema, b)) is False:
        error = ChunkOrderError(
            f"dump request {task.request}: the chunk of {task.table} planned to end at key {task.end} does "
            f"not advance past the last completed chunk's end {last} in the key's order: the source's "
            "chunk plan and its key comparisons disagree, so the dump would loop or skip rows. It is "
            "stopped; report it with the table's key definition (a type whose order is not carried: "
            "exclude the table and dump it by key list)")
        fail(error)
        raise error


def fail_window(state: RedisState, window: Window, error: BaseException | str, step: str,
                request_failed: bool = True) -> bool:
    """A chunk failed between its LW and its finish (``step``: select, wait_hw, ...): close its
    window as failed, so it no longer holds the apply frontier back, and mark the request
    failed (``request_failed``; not when the chunk is about to be retried). A window closed
    meanwhile (abandoned by a newer run, cancelled) is left as it is. True if this closed it."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    if not state.window_is_open(window.id):
        return False
    state.close_window(window, "failed", {"error": message[:2000], "step": step})
    if request_failed:
        state.set_request_status(window.request, "failed", message[:2000])
    return True


MISSING_SHOWN = 20   # missing keys listed in a log line (all of them, up to 10,000, in progress)


def missing_note(missing: list) -> str:
    """``; N requested key(s) not in the source: [..], ...`` for a log line ('' for none)."""
    if not missing:
        return ""
    shown = ", ".join(json.dumps([encode_scalar(v) for v in k]) for k in missing[:MISSING_SHOWN])
    more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
    return f"; {len(missing)} requested key(s) not in the source: {shown}{more}"
