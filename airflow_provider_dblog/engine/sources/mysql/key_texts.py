"""Keys from a user in the text the MySQL/MariaDB source prints for them (its dump's and
its log's, convert.to_logical), for TIME keys (text:interval). A key's text may come from a
person ('3', '0:0:3', '1 01:00:00') or from a PostgreSQL target's interval ('2 days', '1 mon').

- A text engine/values.interval_key_us reads (H:MM:SS[.f], PostgreSQL's units) is taken by its
  value, as the target's interval is ('2 days' is 48:00:00, as PostgreSQL reads it; MariaDB
  would read 00:00:02): the source's own text of that value, or, when no row can hold it (past
  838:59:59, a fraction finer than the column's), the text as given (its delete is exact).
- Any other text is read by the server (CAST AS TIME(6), as its WHERE does): its own text of
  the value; a text it reads only in part (a warning), finer than the column or not at all is
  refused: the source and a target would take it for different keys.
"""
from __future__ import annotations

import datetime as dt

from ...errors import InvalidKeyError
from ...keys import by_value
from ...schema import TableSchema
from ...values import interval_key_us
from .convert import format_time, to_logical

TIME_MAX_US = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999


def canonical_keys(source, table: TableSchema, keys: list[tuple]) -> list[tuple]:
    """``Source.canonical_keys`` of a MySQLSource (bound to it as a method)."""
    cols = [i for i, c in enumerate(table.key_columns) if by_value(c.type)]   # TIME
    if not cols or not keys:
        return keys
    native = source.native_columns(table.qualified)
    out = [list(k) for k in keys]
    with source._lock, source._cursor() as cur:   # (each CAST and its warning count on one session)
        for i in cols:
            n = native[table.key[i]]
            for k in out:
                us = interval_key_us(str(k[i]))
                if isinstance(us, int):
                    if abs(us) <= TIME_MAX_US and us % 10 ** (6 - int(n.fsp)) == 0:
                        k[i] = format_time(dt.timedelta(microseconds=us), int(n.fsp))
                    continue   # (else no row's key: as given)
                cur.execute("SELECT CAST(%s AS TIME(6))", (k[i],))
                (v,) = cur.fetchone()
                fine = v is not None and v.microseconds % 10 ** (6 - int(n.fsp)) != 0
                if v is None or cur.warning_count or fine:   # (this statement's own warnings)
                    raise InvalidKeyError(
                        f"{table.qualified}.{table.key[i]} ({n.column_type}): the server reads {k[i]!r} "
                        + ("as no time value" if v is None else f"only in part (as {format_time(v, 6)})"
                           if cur.warning_count else f"as {format_time(v, 6)}, finer than the column")
                        + ": write it as [-]H:MM:SS[.ffffff]")
                k[i] = to_logical(n, v)
    return [tuple(k) for k in out]
