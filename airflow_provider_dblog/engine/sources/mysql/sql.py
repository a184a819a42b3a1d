"""MySQL SQL text: quoted identifiers, literals of key values, and key-range
predicates that MariaDB's range optimiser turns into primary-key range scans."""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Callable, Sequence

from ..sql_source import quote_with


def quote_ident(name: str) -> str:
    """A MySQL identifier in backticks (embedded backticks doubled)."""
    return quote_with("`", name)


def quote_table(qualified: str) -> str:
    db, _, table = qualified.partition(".")
    return f"{quote_ident(db)}.{quote_ident(table)}"


def unquote_ident(ident: str) -> str:
    """An identifier as a statement wrote it (backticked or bare) -> its name."""
    ident = ident.strip()
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def sql_literal(value: Any) -> str:
    """A key value (read from the database itself) as a MySQL literal.

    Only for values that came from the source (chunk bounds), never for user
    input, and only valid in a session without NO_BACKSLASH_ESCAPES (the JDBC
    session sets its sql_mode, see jdbc.py)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"cannot render non-finite float {value!r}")
        return repr(value)   # the shortest text that reads back as the same double
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"cannot render non-finite decimal {value!r}")
        return format(value, "f")
    if isinstance(value, str):
        escaped = (value.replace("\\", "\\\\").replace("'", "''")
                   .replace("\x00", "\\0").replace("\x1a", "\\Z"))
        return f"'{escaped}'"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            raise ValueError(f"cannot render timezone-aware datetime {value!r}")
        return "'" + value.isoformat(sep=" ", timespec="microseconds") + "'"
    if isinstance(value, dt.date):
        return "'" + value.isoformat() + "'"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "X'" + bytes(value).hex() + "'"
    raise TypeError(f"cannot render a {type(value).__name__} key value as SQL: {value!r}")


def key_predicate(cols: Sequence[str], op: str, vals: Sequence[Any], lit: Callable[[Any], str]) -> str:
    """``(cols) > (vals)`` (op ">") or ``(cols) <= (vals)`` (op "<=") expanded into
    comparisons of single columns, so that MariaDB's range optimiser uses the key.

    ``lit`` renders each value (``sql_literal``, or a ``BoundParams`` that binds);
    it is called in text order, left to right."""
    if op not in (">", "<="):
        raise ValueError(f"a key predicate compares with > or <=, not {op!r}")
    q = [quote_ident(c) for c in cols]
    if len(q) == 1:
        return f"{q[0]} {op} {lit(vals[0])}"
    strict = op[0]                       # a later column decides: > or <
    prefix = f"{q[0]} {'>=' if op == '>' else '<='} {lit(vals[0])}"
    ors = []
    for i in range(len(q)):
        parts = [f"{q[j]} = {lit(vals[j])}" for j in range(i)] + [f"{q[i]} {strict} {lit(vals[i])}"]
        ors.append("(" + " AND ".join(parts) + ")")
    if op == "<=":                       # the bound itself
        ors.append("(" + " AND ".join(f"{q[j]} = {lit(vals[j])}" for j in range(len(q))) + ")")
    return f"({prefix} AND ({' OR '.join(ors)}))"


class BoundParams:
    """A literal renderer that binds: each value becomes %s and joins ``args``."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.args.append(value)
        return "%s"
