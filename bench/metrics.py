"""Small numeric helpers: percentiles, and matching writes to changelog positions
and to the times those positions became durable (tail) or applied (target)."""
from __future__ import annotations

import bisect
import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.store import LOG_PREFIX, SUFFIX


def pct(values, q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: p99 is a value that occurred)."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]


def summary(values) -> dict:
    v = [x for x in values if x is not None]
    r = lambda x: None if x is None else round(x, 4)  # noqa: E731
    return {"n": len(v), "p50": r(pct(v, 50)), "p90": r(pct(v, 90)), "p99": r(pct(v, 99)),
            "max": r(max(v) if v else None)}


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def positions_by_wseq(store, table: str) -> dict[int, str]:
    """wseq -> encoded position of its event, from the tail's log segments only
    (snapshot files hold the dump's copies of rows, not the writes)."""
    out: dict[int, str] = {}
    d = Path(store.table_dir(table))
    for f in sorted(d.glob(f"{LOG_PREFIX}*{SUFFIX}")):
        t = pq.read_table(f, columns=["pos", "after"])
        wseq = pc.struct_field(t["after"], "wseq").to_pylist()
        for w, p in zip(wseq, t["pos"].to_pylist()):
            if w is not None:
                out.setdefault(w, p)
    return out


class Timeline:
    """Monotonic (position, time) samples; ``covered_at(p)`` is the first time the
    sampled position passed ``p`` (the tail checkpoint, or a target's applied position)."""

    def __init__(self, samples: list[tuple[Position | str, float]]):
        samples = sorted(((p.encode() if isinstance(p, Position) else p), t) for p, t in samples)
        self.pos = [p for p, _ in samples]
        self.t = [t for _, t in samples]

    def covered_at(self, pos: str) -> float | None:
        i = bisect.bisect_right(self.pos, pos)  # first sample with position > pos
        return self.t[i] if i < len(self.t) else None
