"""A plain WHERE condition from a user, parsed strictly and turned into bound SQL.

Accepted: comparisons of a column of the table with literals, joined by AND/OR,
with parentheses:

    status = 'new' AND (total >= 100 OR placed_at < '2025-01-01')
    id IN (1, 2, 3)    price BETWEEN 1.5 AND 9    note IS NOT NULL    sku LIKE 'A-%'

Everything else (functions, sub-queries, other tables, comments, ``;``) is
refused with a message saying what was not understood. Literals become bound
parameters typed by the column; the SQL text holds only quoted column names,
operators and placeholders, so no user text is ever pasted into SQL.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError
from .schema import TableSchema, coerce_value

_TOKEN = re.compile(r"""\s*(?:
    (?P<number>[+-]?\d+(?:\.\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<op><=|>=|<>|!=|=|<|>)
  | (?P<punct>[(),])
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<bad>\S)
)""", re.X)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "BETWEEN", "IS", "NULL", "LIKE"}
MAX_LENGTH = 2000


class ConditionError(ConfigError):
    """A WHERE condition that is not a plain condition on the table's columns."""


@dataclass(frozen=True)
class Condition:
    """Parsed: ``sql`` with ``%s`` placeholders and quoted columns, and its ``params``."""
    text: str
    sql: str
    params: tuple


def parse_condition(table: TableSchema, text: str, quote: Callable[[str], str]) -> Condition:
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("the WHERE condition is empty")
    if len(text) > MAX_LENGTH:
        raise ConditionError(f"the WHERE condition is longer than {MAX_LENGTH} characters")
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "bad":
            raise ConditionError(f"unexpected {value!r} in the WHERE condition: only column comparisons "
                                 "with literals, AND, OR and parentheses are allowed")
        if kind == "word" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        tokens.append((kind, value))
    p = _Parser(table, tokens, quote)
    sql = p.expr()
    if p.i != len(tokens):
        raise ConditionError(f"unexpected {tokens[p.i][1]!r} in the WHERE condition")
    return Condition(text, sql, tuple(p.params))


class _Parser:
    def __init__(self, table: TableSchema, tokens, quote):
        self.table, self.tokens, self.quote = table, tokens, quote
        self.i = 0
        self.params: list[Any] = []

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            want = value or kind
            got = "the end" if tok is None else repr(tok[1])
            raise ConditionError(f"expected {want} but found {got} in the WHERE condition")
        self.i += 1
        return tok[1]

    def accept(self, kind: str, value: str) -> bool:
        if self.peek() == (kind, value):
            self.i += 1
            return True
        return False

    def expr(self) -> str:
        parts = [self.term()]
        while self.accept("kw", "OR"):
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"

    def term(self) -> str:
        parts = [self.factor()]
        while self.accept("kw", "AND"):
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def factor(self) -> str:
        if self.accept("kw", "NOT"):
            return f"NOT {self.factor()}"
        if self.accept("punct", "("):
            inner = self.expr()
            self.take("punct", ")")
            return f"({inner})"
        return self.comparison()

    def literal(self, column) -> None:
        tok = self.peek()
        if tok is None or tok[0] not in ("number", "string"):
            got = "the end" if tok is None else repr(tok[1])
            raise ConditionError(f"expected a number or a 'quoted string' after {column.name}, found {got}")
        self.i += 1
        raw = tok[1][1:-1].replace("''", "'") if tok[0] == "string" else tok[1]
        try:
            self.params.append(coerce_value(column.type, raw) if column.type not in ("float32", "float64")
                               else float(raw))
        except (ValueError, TypeError) as e:
            raise ConditionError(f"{column.name} ({column.type}): {e}") from None

    def comparison(self) -> str:
        name = self.take("word")
        try:
            column = self.table.column(name)
        except KeyError:
            raise ConditionError(f"{self.table.qualified} has no column {name!r}; columns: "
                                 f"{', '.join(self.table.column_names)}") from None
        col = self.quote(column.name)
        tok = self.peek()
        if tok and tok[0] == "op":
            self.i += 1
            self.literal(column)
            return f"{col} {'<>' if tok[1] == '!=' else tok[1]} %s"
        negate = self.accept("kw", "NOT")
        if self.accept("kw", "IN"):
            self.take("punct", "(")
            n = 0
            while True:
                self.literal(column)
                n += 1
                if not self.accept("punct", ","):
                    break
            self.take("punct", ")")
            if n > 1000:
                raise ConditionError("at most 1000 values in an IN list")
            return f"{col} {'NOT IN' if negate else 'IN'} ({', '.join(['%s'] * n)})"
        if self.accept("kw", "BETWEEN"):
            self.literal(column)
            self.take("kw", "AND")
            self.literal(column)
            return f"{col} {'NOT BETWEEN' if negate else 'BETWEEN'} %s AND %s"
        if self.accept("kw", "LIKE"):
            if column.type not in ("string", "json"):
                raise ConditionError(f"LIKE needs a text column; {column.name} is {column.type}")
            self.literal(column)
            return f"{col} {'NOT LIKE' if negate else 'LIKE'} %s"
        if not negate and self.accept("kw", "IS"):
            is_not = self.accept("kw", "NOT")
            self.take("kw", "NULL")
            return f"{col} IS {'NOT ' if is_not else ''}NULL"
        got = "the end" if tok is None else repr(tok[1])
        raise ConditionError(f"expected an operator (=, <>, <, <=, >, >=, IN, BETWEEN, LIKE, IS NULL) "
                             f"after {name}, found {got}")
