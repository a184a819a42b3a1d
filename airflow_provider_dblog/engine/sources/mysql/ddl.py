"""Statements of the binlog's query events, read with a real SQL parser (sqlglot's MySQL
dialect): what each does to the captured tables.

- ALTERED: the table's shape may have changed; the reader reads its catalog again and
  checks it against what the statement did (``Altered``: the columns it adds, drops and
  renames, in statement order, and the default literals it gives added columns).
- TRUNCATED: emptied (TRUNCATE TABLE): a step of its history.
- BROKEN: its rows changed without row events, or the statement cannot be read: DROP /
  RENAME / CREATE OR REPLACE TABLE, DROP DATABASE, ALTER TABLE ... RENAME TO, partitions
  dropped, truncated, exchanged or converted, a column dropped and added again or two
  columns swapping names (existing rows then hold other values under a name), and any
  statement the parser cannot read that names the table.

The parser reads MariaDB's partition clauses only in part, so an ALTER TABLE it cannot
read is read again at the level of its tokens (sqlglot's tokenizer): the clauses that
keep every row (ADD / REORGANIZE / COALESCE / REBUILD / ... PARTITION, REMOVE
PARTITIONING) leave the table altered; any other breaks it, naming the statement.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from ...mysql_widening import strict
from .sql import unquote_ident

# sqlglot warns on every statement it falls back to a Command for: we read those ourselves
logging.getLogger("sqlglot").setLevel(logging.ERROR)

ALTERED, TRUNCATED, BROKEN = "altered", "truncated", "broken"


@dataclass(frozen=True)
class Altered:
    """What an ALTER TABLE did to the columns, in statement order (names as written)."""
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()                    # IF EXISTS drops of absent columns included
    renamed: tuple[tuple[str, str], ...] = ()         # net (old, new), renames in order composed
    defined: tuple[str, ...] = ()                     # columns ADD / MODIFY / CHANGE / ALTER define
    defaults: dict[str, object] = field(default_factory=dict)   # added column -> its DEFAULT literal
    # (exp.Literal's python value: str, or Decimal for a number; None: DEFAULT NULL)

    def columns_after(self, before: Sequence[str]) -> set[str]:
        """The column names (lower case: MariaDB's are case-insensitive) the table has after
        the statement, from those it had before."""
        cols = {c.lower() for c in before}
        for a, b in self.renamed:
            cols.discard(a.lower())
        cols -= {c.lower() for c in self.dropped}
        return cols | {b.lower() for _, b in self.renamed} | {c.lower() for c in self.added}


@dataclass(frozen=True)
class TableStatement:
    table: str
    effect: str                 # ALTERED | TRUNCATED | BROKEN
    why: str = ""               # BROKEN: what happened to the table's rows
    altered: Altered | None = None
    query: str = ""             # the statement's text, and the database it ran in
    db: str = ""
    sql_mode: int | None = None   # its session's (the binlog event's; None: not known)

    @property
    def strict(self) -> bool:
        """Run in strict mode (without it, an ALTER may have converted values)."""
        return strict(self.sql_mode)


def _name(table: exp.Table, default_db: str) -> str:
    return f"{table.db or default_db}.{table.name}"


def _short(query: str, limit: int = 300) -> str:
    text = " ".join(query.split())
    return text if len(text) <= limit else text[:limit] + " ..."


# ALTER TABLE clauses (their leading keywords) that keep every row of the table
_KEEPS_ROWS = (("ADD", "PARTITION"), ("REORGANIZE", "PARTITION"), ("COALESCE", "PARTITION"),
               ("REBUILD", "PARTITION"), ("OPTIMIZE", "PARTITION"), ("ANALYZE", "PARTITION"),
               ("CHECK", "PARTITION"), ("REMOVE", "PARTITIONING"), ("PARTITION", "BY"),
               ("FORCE",), ("ENGINE",), ("ALGORITHM",), ("LOCK",), ("COMMENT",))
# clauses that remove or replace rows without row events
_LOSES_ROWS = {("DROP", "PARTITION"): "dropped partitions", ("TRUNCATE", "PARTITION"): "truncated partitions",
               ("EXCHANGE", "PARTITION"): "exchanged a partition with another table",
               ("CONVERT", "PARTITION"): "converted a partition to a table",
               ("CONVERT", "TABLE"): "converted a table into a partition",
               ("DISCARD",): "discarded its tablespace", ("IMPORT",): "imported a tablespace",
               ("REPAIR", "PARTITION"): "repaired partitions (rows may be lost)"}


def _tokens(query: str) -> list:
    """The statement's tokens; the MySQL tokenizer takes the rest of a statement it reads
    as a command (RENAME ...) as one string: that rest is tokenized again."""
    try:
        tokens = sqlglot.tokenize(query, read="mysql")
        rest = query[tokens[0].end + 1:] if len(tokens) == 2 else ""
        if tokens[1:] and tokens[1].token_type == TokenType.STRING and rest.strip()[:1] not in ("'", '"', ""):
            tokens = tokens[:1] + sqlglot.tokenize(rest, read="mysql")
        return tokens
    except SqlglotError:
        return []


def _qualified_names(tokens: list, default_db: str) -> list[list[str]]:
    """The top-level comma-separated parts of ``tokens`` as lists of names: a ``db . t``
    or a bare ``t`` (in ``default_db``) each; other words are left out."""
    parts, cur, i = [], [], 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.token_type == TokenType.COMMA:
            parts.append(cur)
            cur = []
        elif i + 2 < len(tokens) and tokens[i + 1].token_type == TokenType.DOT:
            cur.append(f"{tok.text}.{tokens[i + 2].text}")
            i += 2
        elif tok.token_type == TokenType.IDENTIFIER or tok.text.upper() not in ("TO", "TABLE", "TABLES", "WAIT",
                                                                                "NOWAIT"):
            cur.append(f"{default_db}.{tok.text}")
        i += 1
    return parts + [cur]


def _rename_tables(query: str, default_db: str, tables: Sequence[str]) -> list[TableStatement]:
    """RENAME TABLE a TO b [, c TO d ...]: a captured table renamed away, or another table
    renamed onto a captured table's name, has other rows under that name from here."""
    out = {}
    for part in _qualified_names(_tokens(query)[2:], default_db):
        if len(part) != 2:
            return _named_unreadable(query, default_db, tables)
        a, b = part
        if a in tables:
            out.setdefault(a, f"renamed to {b} ({_short(query)})")
        if b in tables:
            out.setdefault(b, f"{a} was renamed onto its name ({_short(query)})")
    return [TableStatement(t, BROKEN, why) for t, why in out.items()]


def _alter_clauses(tokens: list) -> tuple[list[str], list[list[str]]]:
    """An ALTER TABLE's name parts and its top-level comma-separated clauses, each as its
    tokens' upper-cased texts (identifiers unquoted)."""
    i = 1
    while i < len(tokens) and tokens[i].text.upper() in ("ONLINE", "IGNORE", "TABLE", "IF", "EXISTS"):
        i += 1
    name = [tokens[i].text] if i < len(tokens) else []
    i += 1
    if i + 1 < len(tokens) and tokens[i].token_type == TokenType.DOT:
        name.append(tokens[i + 1].text)
        i += 2
    clauses, depth, cur = [], 0, []
    for tok in tokens[i:]:
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
        elif tok.token_type == TokenType.R_PAREN:
            depth -= 1
        if depth == 0 and tok.token_type == TokenType.COMMA:
            clauses.append(cur)
            cur = []
            continue
        cur.append(tok.text.upper())
    if cur:
        clauses.append(cur)
    return name, clauses


def _unparsed_alter(query: str, default_db: str, tables: Sequence[str]) -> list[TableStatement]:
    tokens = _tokens(query)
    if len(tokens) < 3:
        return _named_unreadable(query, default_db, tables)
    name, clauses = _alter_clauses(tokens)
    table = ".".join(name) if len(name) == 2 else f"{default_db}.{name[0]}" if name else ""
    if table not in tables:
        # EXCHANGE PARTITION ... WITH TABLE <captured>: the other side loses its rows too
        return _named_unreadable(query, default_db, tables, exclude=table)
    out = []
    for clause in clauses:
        lead = tuple(w for w in clause[:2] if w != "COLUMN")
        lost = next((why for k, why in _LOSES_ROWS.items() if lead[:len(k)] == k), None)
        if lost:
            out.append(TableStatement(table, BROKEN, f"ALTER TABLE {lost} ({_short(query)}): its rows changed "
                                                     "without row events"))
            if lead[:2] == ("EXCHANGE", "PARTITION"):   # and the table it was exchanged with
                out += _named_unreadable(query, default_db, tables, exclude=table, why="exchanged a partition "
                                         "with it")
            return out
        if not any(lead[:len(k)] == k for k in _KEEPS_ROWS):
            return [TableStatement(table, BROKEN, f"an ALTER TABLE the reader cannot read changed it "
                                                  f"({_short(query)}): the table is quarantined rather than "
                                                  "guessed at")]
    return [TableStatement(table, ALTERED, altered=Altered())]


def _named_unreadable(query: str, default_db: str, tables: Sequence[str], exclude: str = "",
                      why: str = "") -> list[TableStatement]:
    """The captured tables an unreadable statement names (by its identifier tokens: a name
    qualified with its database, or a bare one in the statement's default database)."""
    tokens = _tokens(query)
    texts = [(t.text, t.token_type) for t in tokens]
    named = set()
    for i, (text, _) in enumerate(texts):
        if i + 2 < len(texts) and texts[i + 1][1] == TokenType.DOT:
            named.add(f"{text}.{texts[i + 2][0]}".lower())
        named.add(f"{default_db}.{text}".lower())
    why = why or f"a statement the reader cannot read names it ({_short(query)})"
    return [TableStatement(t, BROKEN, f"{why}: the table is quarantined rather than guessed at")
            for t in tables if t.lower() in named and t != exclude]


def _default_literal(col: exp.ColumnDef) -> tuple[bool, object]:
    """(True, value) for a DEFAULT that is a literal (or NULL) in the statement, else (False, None)."""
    for c in col.args.get("constraints") or []:
        kind = c.args.get("kind")
        if isinstance(kind, exp.DefaultColumnConstraint):
            value = kind.this
            while isinstance(value, exp.Paren):
                value = value.this
            neg = isinstance(value, exp.Neg)
            value = value.this if neg else value
            if isinstance(value, exp.Null):
                return True, None
            if isinstance(value, exp.Literal):
                if value.is_string:
                    return True, value.this
                try:
                    return True, -Decimal(value.this) if neg else Decimal(value.this)
                except InvalidOperation:
                    return False, None
            return False, None
    return True, None


def literal_default(text: str) -> tuple[bool, object]:
    """A column default as information_schema shows it (``'it''s'``, ``1.50``), read as
    the statement's literals are: (True, value), or (False, None) for an expression."""
    try:
        e = sqlglot.parse_one(f"CREATE TABLE x (c INT DEFAULT {text})", read="mysql")
    except SqlglotError:
        return False, None
    col = e.find(exp.ColumnDef)
    return _default_literal(col) if col is not None else (False, None)


def _alter(e: exp.Alter, query: str, default_db: str, tables: Sequence[str]) -> list[TableStatement]:
    table = _name(e.this, default_db)
    if table not in tables:
        return []
    # Every column an ALTER TABLE names is one the table had before it (MariaDB and MySQL
    # check them against the table as it was: RENAME COLUMN a TO b, RENAME COLUMN b TO a
    # swaps), so the clauses are read side by side, not one after another.
    added, dropped, defined, defaults = [], [], [], {}
    came_from: dict[str, str] = {}   # a name after the statement (lower) -> the column it was
    shown: dict[str, str] = {}       # that name as written
    for action in e.args.get("actions") or []:
        if isinstance(action, exp.AlterRename):
            return [TableStatement(table, BROKEN, f"renamed to {_name(action.this, default_db)} "
                                                  f"({_short(query)})")]
        if isinstance(action, exp.RenameColumn):
            a, b = action.this.name, action.args["to"].name
            came_from[b.lower()], shown[b.lower()] = a, b
        elif isinstance(action, exp.ModifyColumn):
            source = action.args.get("rename_from")
            if source is not None:
                a = source.name if isinstance(source, exp.Expression) else str(source)
                came_from[action.this.name.lower()], shown[action.this.name.lower()] = a, action.this.name
            defined.append(action.this.name)
        elif isinstance(action, exp.ColumnDef):
            added.append(action.name)
            defined.append(action.name)
            literal, value = _default_literal(action)
            if literal:
                defaults[action.name] = value
        elif isinstance(action, exp.Drop) and (action.args.get("kind") or "").upper() == "COLUMN":
            dropped.extend(c.name for c in action.args.get("tables") or [])
        elif isinstance(action, exp.AlterColumn):
            defined.append(action.this.name)
    renamed = tuple((a, shown[b]) for b, a in came_from.items() if a.lower() != b)
    # a name whose column went away (dropped, renamed) that now names another column
    # (added, or renamed onto it: a swap): existing rows hold other values under it, and
    # no row event says so
    went = {c.lower() for c in dropped} | {a.lower() for a, _ in renamed}
    reused = sorted(n for n in went if n in {c.lower() for c in added} or
                    (n in came_from and came_from[n].lower() != n))
    if reused:
        return [TableStatement(table, BROKEN, f"column{'s' if len(reused) > 1 else ''} {', '.join(reused)} "
                                              f"now hold{'' if len(reused) > 1 else 's'} another column's values "
                                              f"(dropped and added again, or renamed onto) ({_short(query)}): "
                                              "existing rows changed without row events")]
    return [TableStatement(table, ALTERED, altered=Altered(tuple(added), tuple(dropped), renamed, tuple(defined),
                                                           defaults))]


# objects other than tables whose CREATE / DROP / ALTER name a table without changing its rows
_OTHER_OBJECTS = {"TRIGGER", "VIEW", "PROCEDURE", "FUNCTION", "EVENT", "USER", "ROLE", "INDEX", "SEQUENCE",
                  "SERVER", "PACKAGE", "SYNONYM"}


def _other_object(head: list[str]) -> bool:
    return len(head) > 1 and head[0] in ("CREATE", "DROP", "ALTER") and head[1] in _OTHER_OBJECTS


def read_statement(query: str, default_db: str, tables: Sequence[str],
                   sql_mode: int | None = None) -> list[TableStatement]:
    """What the statement (run with ``default_db`` as its database and ``sql_mode``, its
    binlog event's) does to each of ``tables`` ("db.table") it touches; [] for those it
    leaves alone."""
    return [dataclasses.replace(s, query=str(query), db=default_db, sql_mode=sql_mode)
            for s in _read_statement(query, default_db, tables)]


def _read_statement(query: str, default_db: str, tables: Sequence[str]) -> list[TableStatement]:
    text = str(query)
    tokens = _tokens(text)
    if len(tokens) > 2 and tokens[0].text.upper() == "ALTER" and tokens[1].text.upper() in ("ONLINE", "IGNORE"):
        text = text[:tokens[1].start] + text[tokens[1].end + 1:]   # MariaDB's words the parser lacks
        tokens = _tokens(text)
    try:
        e = sqlglot.parse_one(text, read="mysql")
    except SqlglotError:
        e = None
    # the statement's verb and the kind of object it names (CREATE [OR REPLACE] [DEFINER=...] TRIGGER ...)
    words = [t.text.upper() for t in tokens[:12]]
    head = words[:1] + [w for w in words[1:] if w in ("TABLE", "TABLES") or w in _OTHER_OBJECTS][:1]
    if e is None or isinstance(e, exp.Command):
        if head[:1] == ["ALTER"] and "TABLE" in head:
            return _unparsed_alter(text, default_db, tables)
        if head[:2] in (["RENAME", "TABLE"], ["RENAME", "TABLES"]):
            return _rename_tables(text, default_db, tables)
        if head[:1] in (["OPTIMIZE"], ["ANALYZE"], ["CHECK"], ["FLUSH"], ["CHECKSUM"]) or _other_object(head):
            return []   # keep every row; a trigger's changes come as row events
        return _named_unreadable(text, default_db, tables)
    if isinstance(e, exp.Alter):
        return _alter(e, text, default_db, tables) if (e.args.get("kind") or "").upper() == "TABLE" else []
    if isinstance(e, exp.TruncateTable):
        return [TableStatement(n, TRUNCATED) for n in
                dict.fromkeys(_name(t, default_db) for t in e.expressions) if n in tables]
    if isinstance(e, exp.Drop):
        kind = (e.args.get("kind") or "").upper()
        if e.args.get("temporary"):   # a session's temporary table, not the captured one
            return []
        if kind == "TABLE":
            return [TableStatement(n, BROKEN, f"DROP TABLE ({_short(text)}): its rows are gone without row events")
                    for n in dict.fromkeys(_name(t, default_db) for t in e.args.get("tables") or [])
                    if n in tables]
        if kind in ("DATABASE", "SCHEMA"):
            db = (e.args.get("tables") or [e.this])[0].name
            return [TableStatement(t, BROKEN, f"DROP DATABASE {db}: its rows are gone without row events")
                    for t in tables if t.split(".", 1)[0] == db]
        return []
    if isinstance(e, exp.Create):
        kind = (e.args.get("kind") or "").upper()
        target = e.find(exp.Table)
        name = _name(target, default_db) if target is not None else ""
        if kind == "TABLE" and name in tables and e.args.get("replace"):
            if (e.args.get("properties") and any(isinstance(p, exp.TemporaryProperty)
                                                  for p in e.args["properties"].expressions)):
                return []
            return [TableStatement(name, BROKEN, f"CREATE OR REPLACE TABLE ({_short(text)}): its rows were "
                                                 "replaced without row events")]
        if kind == "INDEX" and name in tables:
            return [TableStatement(name, ALTERED, altered=Altered())]
        return []
    if isinstance(e, (exp.Grant, exp.Revoke, exp.Analyze, exp.Set, exp.Use, exp.Transaction, exp.Commit,
                      exp.Rollback, exp.Insert, exp.Update, exp.Delete)):
        return []   # DML of a captured table comes as row events (binlog_format=ROW)
    names = {_name(t, default_db) for t in e.find_all(exp.Table)}
    why = f"a {type(e).__name__.upper()} statement the reader does not follow names it ({_short(text)})"
    return [TableStatement(t, BROKEN, why) for t in tables if t in names]


_SAVEPOINT = re.compile(r"^(ROLLBACK\s+(?:WORK\s+)?TO\s+)?(?:SAVEPOINT\s+)?(`(?:[^`]|``)+`|\S+)$", re.I)
_SAVEPOINT_Q = re.compile(r"^\s*(?:SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO)\s", re.I)


def savepoint_statement(query: str) -> tuple[bool, str] | None:
    """``SAVEPOINT s`` -> (False, "s"); ``ROLLBACK [WORK] TO [SAVEPOINT] s`` -> (True, "s");
    any other statement -> None."""
    text = " ".join(str(query).split()).rstrip(";")
    m = _SAVEPOINT.match(text) if _SAVEPOINT_Q.match(text) else None
    if m is None:
        return None
    return bool(m.group(1)), unquote_ident(m.group(2))
