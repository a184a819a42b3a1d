"""Keys from a user in the text the MySQL/MariaDB source prints for them (its dump's and
its log's, convert.to_logical): a TIME key given as '3', '0:0:3' or '1 01:00:00' is the
row '00:00:03.000000' or '25:00:00.000000' of a TIME(6) column. The server reads each
text as the column's type (CAST, as its WHERE does), so a requested key matches its
row's text; one the server cannot read as the type is refused (InvalidKeyError)."""
from __future__ import annotations

from ...errors import InvalidKeyError
from ...keys import KEYS_BY_VALUE
from ...schema import TableSchema
from .convert import to_logical

BATCH = 500   # keys per SELECT (one expression each)


def canonical_keys(source, table: TableSchema, keys: list[tuple]) -> list[tuple]:
    """``Source.canonical_keys`` of a MySQLSource (bound to it as a method)."""
    cols = [i for i, c in enumerate(table.key_columns) if c.type in KEYS_BY_VALUE]   # TIME
    if not cols or not keys:
        return keys
    native = source.native_columns(table.qualified)
    out = [list(k) for k in keys]
    for i in cols:
        n = native[table.key[i]]
        for start in range(0, len(out), BATCH):
            part = out[start:start + BATCH]
            exprs = ", ".join([f"CAST(%s AS TIME({int(n.fsp)}))"] * len(part))
            (row,) = source._query(f"SELECT {exprs}", [k[i] for k in part])
            for k, v in zip(part, row):
                if v is None:
                    raise InvalidKeyError(f"{table.qualified}.{table.key[i]} ({n.column_type}): "
                                          f"{k[i]!r} is not a time value the server reads")
                k[i] = to_logical(n, v)
    return [tuple(k) for k in out]
