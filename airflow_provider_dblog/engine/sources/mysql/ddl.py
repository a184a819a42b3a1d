"""Statements of the binlog's query events that the reader must understand: DDL
that changes a table's rows without row events, and savepoints."""
from __future__ import annotations

import re
from typing import Sequence

from .sql import unquote_ident

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_QNAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
_DDL = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(TRUNCATE(?:\s+TABLE)?|DROP\s+(?:TEMPORARY\s+)?TABLES?(?:\s+IF\s+EXISTS)?"
    r"|RENAME\s+TABLES?|CREATE\s+OR\s+REPLACE\s+(?:TEMPORARY\s+)?TABLE|DROP\s+(?:DATABASE|SCHEMA)"
    r"(?:\s+IF\s+EXISTS)?)\s+(.*)$", re.I | re.S)
# words that stand where a table name could, but are not one
_NOT_NAMES = ("TO", "IF", "EXISTS", "WAIT", "NOWAIT", "RESTRICT", "CASCADE", "LIKE", "AS")
_SAVEPOINT = re.compile(r"^(ROLLBACK\s+(?:WORK\s+)?TO\s+)?(?:SAVEPOINT\s+)?(`(?:[^`]|``)+`|\S+)$", re.I)
_SAVEPOINT_Q = re.compile(r"^\s*(?:SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO)\s", re.I)


def ddl_dropped_tables(query: str, default_db: str) -> tuple[str, list[str]]:
    """For DDL that removes a table's rows without row events (TRUNCATE, DROP TABLE,
    RENAME TABLE, CREATE OR REPLACE TABLE, DROP DATABASE): the statement's verb and
    the "db.table" names it touches ("db.*" for a whole database); else ("", [])."""
    m = _DDL.match(query)
    if not m:
        return "", []
    verb = " ".join(m.group(1).upper().split())
    if "TEMPORARY" in verb:  # a session's temporary table, not the captured one
        return "", []
    rest = re.sub(r"/\*.*?\*/", " ", m.group(2), flags=re.S)
    if verb.startswith(("DROP DATABASE", "DROP SCHEMA")):
        n = re.match(rf"\s*({_IDENT})", rest)
        return verb, [f"{unquote_ident(n.group(1))}.*"] if n else []
    names = []
    for q in re.findall(_QNAME, rest):
        parts = [unquote_ident(p) for p in re.split(rf"\s*\.\s*(?={_IDENT})", q, maxsplit=1)]
        if len(parts) == 1 and parts[0].upper() in _NOT_NAMES:
            continue
        names.append(f"{parts[0]}.{parts[1]}" if len(parts) == 2 else f"{default_db}.{parts[0]}")
        if verb.startswith("CREATE") or verb.startswith("TRUNCATE"):
            break  # one table; the rest is its definition
    return verb, names


def broken_tables(query: str, default_db: str, tables: Sequence[str]) -> tuple[str, list[str]]:
    """(the statement's verb, the ones of ``tables`` it empties or replaces): those have
    rows that changed without row events, and their copies would silently differ."""
    verb, names = ddl_dropped_tables(query, default_db)
    hit = [t for t in tables for name in names
           if t == name or (name.endswith(".*") and t.split(".", 1)[0] == name[:-2])]
    return verb, list(dict.fromkeys(hit))


_ALTER = re.compile(rf"^\s*(?:/\*.*?\*/\s*)*ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?({_QNAME})",
                    re.I | re.S)


def altered_table(query: str, default_db: str) -> str | None:
    """The "db.table" an ALTER TABLE statement changes, else None."""
    m = _ALTER.match(query)
    if not m:
        return None
    parts = [unquote_ident(p) for p in re.split(rf"\s*\.\s*(?={_IDENT})", m.group(1), maxsplit=1)]
    return f"{parts[0]}.{parts[1]}" if len(parts) == 2 else f"{default_db}.{parts[0]}"


_RENAME_COLUMN = re.compile(
    rf"(?:\bRENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+TO\s+({_IDENT}))"
    rf"|(?:\bCHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+({_IDENT}))", re.I)


def renamed_columns(query: str) -> list[tuple[str, str]]:
    """The (old, new) column names an ALTER TABLE statement renames (RENAME COLUMN a TO b,
    CHANGE [COLUMN] a b ...): the binlog gives no column identity, only the statement.
    A name that stays (CHANGE a a INT) is no rename."""
    if not _ALTER.match(query):
        return []
    text = re.sub(r"/\*.*?\*/|'(?:[^'\\]|\\.|'')*'", " ", query, flags=re.S)   # comments, string literals
    out = []
    for m in _RENAME_COLUMN.finditer(text):
        a, b = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        a, b = unquote_ident(a), unquote_ident(b)
        if a.lower() != b.lower():
            out.append((a, b))
    return out


def savepoint_statement(query: str) -> tuple[bool, str] | None:
    """``SAVEPOINT s`` -> (False, "s"); ``ROLLBACK [WORK] TO [SAVEPOINT] s`` -> (True, "s");
    any other statement -> None."""
    text = " ".join(str(query).split()).rstrip(";")
    m = _SAVEPOINT.match(text) if _SAVEPOINT_Q.match(text) else None
    if m is None:
        return None
    return bool(m.group(1)), unquote_ident(m.group(2))
