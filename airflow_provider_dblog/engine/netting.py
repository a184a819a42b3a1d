"""A committed transaction's row changes as one final change per key.

Per key, a target keeps the latest event (the apply's rule). That is right as long
as no two rows ever share a key inside a transaction. Under a DEFERRABLE primary key
(PostgreSQL) they can: ``UPDATE t SET id = 3 - id`` moves row 1 to key 2 before row
2 has left it, so the log says "insert 2" and then "delete 2" (row 2 moving to 1),
and the latest event of key 2 would delete a row the source still has.

:func:`net_changes` follows the rows themselves instead: per key, the images of the
rows that are there (an update or delete names its row by its full old image,
REPLICA IDENTITY FULL), and at the end of the transaction each touched key holds
at most one row (the constraint holds at commit). It emits one event per touched
key: that row (an update, or an insert when no row was there before), or a delete.

Nothing here imports Airflow.
"""
from __future__ import annotations

from typing import Any

from .events import DELETE, INSERT, UPDATE, Event
from .positions import Position


def _ident(image: dict) -> str:
    """A row image's identity (repr: NaN equals NaN, unlike ==)."""
    return repr(tuple(image.values()))


class _Key:
    __slots__ = ("table", "key", "before", "live", "first")

    def __init__(self, table: str, key: tuple, first: int):
        self.table, self.key, self.first = table, key, first
        self.before: dict | None = None     # the row that was there before the transaction
        self.live: list[tuple[dict, str | None]] = []   # rows there now: (image, error)


def net_changes(events: list[Event]) -> list[Event]:
    """One event per (table, key) touched by ``events`` (one committed transaction, in
    log order), positioned in the transaction's order of first touch. Raises
    ValueError if a key would end with two rows (the log is not what it seems)."""
    if not events:
        return events
    keys: dict[tuple[str, tuple], _Key] = {}
    ts = events[-1].source_ts

    def slot(e: Event) -> _Key:
        k = (e.table, e.key)
        if k not in keys:
            keys[k] = _Key(e.table, e.key, len(keys))
        return keys[k]

    def take(s: _Key, image: dict) -> None:
        """The row ``image`` leaves key ``s``: one that arrived in this transaction, or
        the one that was there before it."""
        ident = _ident(image)
        for i, (img, _) in enumerate(s.live):
            if _ident(img) == ident:
                del s.live[i]
                return
        if s.before is None:
            s.before = image

    for e in events:
        s = slot(e)
        if e.op == INSERT:
            s.live.append((e.after, e.error))
        elif e.op == DELETE:
            take(s, e.before)
        else:   # an update of a row that keeps its key
            take(s, e.before)
            s.live.append((e.after, e.error))

    base = events[0].pos
    out = []
    for s in sorted(keys.values(), key=lambda s: s.first):
        pos = Position(base.log, base.offset, len(out))
        if len(s.live) > 1:
            raise ValueError(f"{s.table}: key {s.key!r} holds {len(s.live)} rows at the commit "
                             f"at {base}: not a primary key")
        if s.live:
            after, error = s.live[0]
            op = UPDATE if s.before is not None else INSERT
            out.append(Event(s.table, op, s.key, s.before, after, pos, ts, error))
        elif s.before is not None:
            out.append(Event(s.table, DELETE, s.key, s.before, None, pos, ts))
        # else: rows that came and went inside the transaction: nothing to say
    return out


def needs_netting(seen: set, table: str, key: Any) -> bool:
    """True when (table, key) was already touched in the transaction (``seen`` grows):
    only then can two rows have shared the key."""
    k = (table, key)
    if k in seen:
        return True
    seen.add(k)
    return False
