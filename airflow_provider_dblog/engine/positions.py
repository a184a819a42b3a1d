"""One totally ordered position type for every event, log or dump.

MySQL/MariaDB: (binlog file number, offset of the rows event, row index in it).
PostgreSQL:    (0, commit LSN, change index within the transaction).

A snapshot (dump) row takes its window's high-watermark position and adds its
row index to ``seq``: the HW event is a single-row write alone in its
transaction, so nothing else in the log can sit between those positions.

The string form is fixed-width hex, so it sorts the same way as the tuple in
Python, Parquet statistics, Spark and SQL (``COLLATE "C"``); one column holds it.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_WIDTHS = (8, 16, 8)  # log, offset, seq in hex digits
POSITION_WIDTH = sum(_WIDTHS) + 2
_MAX = tuple(16 ** w - 1 for w in _WIDTHS)
_FORM = re.compile(r"^([0-9a-f]{8})-([0-9a-f]{16})-([0-9a-f]{8})$")


class Position(NamedTuple):
    log: int
    offset: int
    seq: int = 0

    def encode(self) -> str:
        if min(self) < 0:
            raise ValueError(f"negative position {tuple(self)}")
        parts = [format(v, f"0{w}x") for v, w in zip(self, _WIDTHS)]
        if any(len(p) != w for p, w in zip(parts, _WIDTHS)):
            raise ValueError(f"position {tuple(self)} does not fit its encoding")
        return "-".join(parts)

    @classmethod
    def decode(cls, text: str) -> "Position":
        m = _FORM.match(text) if isinstance(text, str) else None
        if m is None:  # only the exact form encode() writes: anything else would sort wrongly
            raise ValueError(f"not a position: {text!r}")
        return cls(*(int(g, 16) for g in m.groups()))

    def with_seq(self, seq: int) -> "Position":
        return Position(self.log, self.offset, seq)

    def just_below(self) -> "Position":
        """The largest encodable position strictly below this one: where a changelog row
        with no log event of its own goes (a sweep's deletes, a rebuild: engine/sweep.py,
        engine/quarantine.py), after everything before this position and before it."""
        if self.seq > 0:
            return Position(self.log, self.offset, self.seq - 1)
        if self.offset > 0:
            return Position(self.log, self.offset - 1, _MAX[2])
        if self.log > 0:
            return Position(self.log - 1, _MAX[1], _MAX[2])
        raise ValueError("no position is below the zero position")

    def __str__(self) -> str:
        return self.encode()


ZERO = Position(0, 0, 0)
