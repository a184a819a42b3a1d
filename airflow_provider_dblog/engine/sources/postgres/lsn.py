"""PostgreSQL log sequence numbers (LSNs): the text form ``"16/B374D848"`` (what
pg_current_wal_lsn() and the resume dicts hold) and the 64-bit int (what the
replication protocol and Positions carry). Their order is the order of the ints."""
from __future__ import annotations

import re

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def lsn_to_int(lsn: str) -> int:
    """``"16/B374D848"`` -> 0x16B374D848."""
    m = _LSN.match(str(lsn).strip())
    if not m:
        raise ValueError(f"not an LSN: {lsn!r}")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def int_to_lsn(value: int) -> str:
    """0x16B374D848 -> ``"16/B374D848"`` (PostgreSQL's form: upper-case hex, no padding)."""
    value = int(value)
    if not 0 <= value < (1 << 64):
        raise ValueError(f"LSN out of range: {value}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
