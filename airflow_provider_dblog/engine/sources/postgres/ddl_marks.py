"""DDL that rewrites a captured table's values with no row change in the log and no shape
a Relation message would show (issue 27, case 1): an enum label renamed (ALTER TYPE ...
RENAME VALUE), a composite type's attributes added, dropped or retyped, a column
rewritten by ALTER TABLE ... ALTER COLUMN ... TYPE ... USING (into its own type, or one a
widening would let flow).

An event trigger on the source (installed by the tail's prepare; creating one needs a
superuser) emits each ALTER TABLE and ALTER TYPE of a type some table uses as a
transactional logical message: it is in the log inside the DDL's transaction, at its
place. The tail (log_marks.py) breaks there each captured table the statement rewrites
(``rewrites``); the statement is read from the message's query text with sqlglot's
PostgreSQL tokenizer. Where that text does not show it (dynamic SQL), a rewrite is
assumed only if it may be one. Nothing here imports Airflow.
"""
from __future__ import annotations

import logging
import re

import psycopg2
import sqlglot
from psycopg2 import sql

log = logging.getLogger(__name__)

DDL_PREFIX = "dblog-ddl"
TRIGGER_FUNCTION = "dblog_ddl_marks"
QUERY_CHARS = 1_000_000    # the statement text a message carries at most

# each ALTER TABLE of a table, each ALTER TYPE of a type with the tables using it (its
# array, its domains and theirs); a failure warns and never stops the user's DDL (%% is % here:
# the source's queries always pass parameters)
_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}() RETURNS event_trigger LANGUAGE plpgsql AS $dblog$
DECLARE r record; typ oid; rels bigint[];
BEGIN
  FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE command_tag IN ('ALTER TABLE', 'ALTER TYPE') LOOP
    IF r.command_tag = 'ALTER TABLE' THEN
      rels := ARRAY[r.objid::bigint];
    ELSE
      typ := CASE WHEN r.object_type = 'composite type' THEN (SELECT reltype FROM pg_class WHERE oid = r.objid)
                  ELSE r.objid END;
      SELECT array_agg(DISTINCT a.attrelid::bigint) INTO rels FROM pg_attribute a
       WHERE a.attnum > 0 AND NOT a.attisdropped AND a.atttypid IN (
         SELECT t.oid FROM pg_type t WHERE t.oid = typ OR t.typelem = typ OR t.typbasetype = typ
             OR t.typelem IN (SELECT d.oid FROM pg_type d WHERE d.typbasetype = typ));
    END IF;
    IF rels IS NOT NULL THEN
      PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
        'tag', r.command_tag, 'object', r.object_identity, 'tables', rels,
        'query', left(current_query(), {chars}))::text);
    END IF;
  END LOOP;
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'dblog: a DDL statement was not marked in the log: %%', SQLERRM;
END $dblog$
"""


def trigger_name(namespace: str) -> str:
    """The event trigger of the source whose watermark table is in ``namespace``."""
    return f"dblog_ddl_marks__{namespace}"[:63]


def install(query, namespace: str) -> str:
    """Create the event trigger (and its function in ``namespace``) if missing; "" when it
    is there, else why not (not a superuser)."""
    function = sql.Identifier(namespace, TRIGGER_FUNCTION)
    name = trigger_name(namespace)
    if query("SELECT 1 FROM pg_event_trigger WHERE evtname = %s", (name,)):
        return ""
    try:
        query(sql.SQL(_FUNCTION).format(function=function, prefix=sql.Literal(DDL_PREFIX),
                                        chars=sql.Literal(QUERY_CHARS)), fetch=False)
        query(sql.SQL("CREATE EVENT TRIGGER {} ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER TYPE') "
                      "EXECUTE FUNCTION {}()").format(sql.Identifier(name), function), fetch=False)
    except psycopg2.errors.InsufficientPrivilege as e:
        return str(e).strip().splitlines()[0]
    log.info("created event trigger %s: ALTER TABLE and ALTER TYPE are marked in the log", name)
    return ""


def uninstall(query, namespace: str) -> None:
    query(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(trigger_name(namespace))), fetch=False)
    query(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(namespace, TRIGGER_FUNCTION)),
          fetch=False)


# ALTER TYPE actions that leave every stored value's text as it was
_KEEPS_VALUES = {("ADD", "VALUE"), ("RENAME", "TO"), ("OWNER", "TO"), ("SET", "SCHEMA"), ("RENAME", "ATTRIBUTE"),
                 ("SET", "(")}
_MAY_REWRITE = re.compile(r"\bTYPE\b.*\bUSING\b", re.IGNORECASE | re.DOTALL)
_DOLLARS = re.compile(r"^\$[A-Za-z_0-9]*\$|\$[A-Za-z_0-9]*\$$")


def _statements(text: str) -> list[list]:
    """The statements of ``text`` as lists of (KIND, word) tokens; a string holding an
    ALTER (a DO block's body) read as statements too."""
    try:
        tokens = sqlglot.Dialect.get_or_raise("postgres").tokenize(text)
    except Exception:   # noqa: BLE001 - text the tokenizer cannot read: no statement shown
        return []
    out, current = [], []
    for t in tokens:
        kind = t.token_type.name
        if kind == "SEMICOLON":
            out.append(current)
            current = []
        elif kind == "STRING" and "alter" in t.text.lower():
            out.extend(_statements(_DOLLARS.sub("", t.text)))
        else:
            current.append((kind, t.text if kind == "IDENTIFIER" else t.text.upper() if kind != "VAR" else t.text))
    out.append(current)
    return [s for s in out if s]


def _word(tok) -> str:
    return tok[1].upper() if tok[0] != "IDENTIFIER" else tok[1]


def _name_at(stmt: list, i: int) -> tuple[str, int]:
    """The last part of the (qualified) name starting at ``stmt[i]``, as the catalog spells
    it, and the index after it."""
    name = ""
    while i < len(stmt):
        kind, text = stmt[i]
        name = text if kind == "IDENTIFIER" else text.lower()
        if i + 1 < len(stmt) and stmt[i + 1][0] == "DOT":
            i += 2
            continue
        return name, i + 1
    return name, i


def _altered(stmts: list[list], what: str, name: str):
    """Each statement ALTER ``what`` of an object named ``name``: the tokens after the name."""
    for s in stmts:
        words = [_word(t) for t in s[:2]]
        if words != ["ALTER", what]:
            continue
        i = 2
        while i < len(s) and _word(s[i]) in ("IF", "EXISTS", "ONLY"):
            i += 1
        got, i = _name_at(s, i)
        if got == name:
            yield s[i:]


def _renamed_to(stmts: list[list], name: str) -> list[list]:
    """The actions of ALTER TYPE ... RENAME TO ``name`` (the trigger names a type by its new name)."""
    out = []
    for s in stmts:
        words = [_word(t) for t in s]
        if words[:2] == ["ALTER", "TYPE"] and "RENAME" in words:
            i = words.index("RENAME")
            if words[i + 1:i + 2] == ["TO"] and i + 2 < len(s) and _name_at(s, i + 2)[0] == name:
                out.append(s[i:])
    return out


def _clauses(rest: list) -> list[list]:
    out, current, depth = [], [], 0
    for t in rest:
        depth += t[0] == "L_PAREN"
        depth -= t[0] == "R_PAREN"
        if t[0] == "COMMA" and depth == 0:
            out.append(current)
            current = []
        else:
            current.append(t)
    return out + [current]


def _using_column(clause: list) -> str | None:
    """The column an ALTER [COLUMN] c [SET DATA] TYPE ... USING ... clause rewrites, or None."""
    words = [_word(t) for t in clause]
    if not words or words[0] != "ALTER" or "TYPE" not in words or "USING" not in words:
        return None
    i = 2 if len(words) > 1 and words[1] == "COLUMN" else 1
    column = _name_at(clause, i)[0] if i < len(clause) else "?"
    return column if words.index("USING") > words.index("TYPE") else None


def rewrites(carried: dict, table: str) -> str:
    """Why the DDL a message carries (``carried``: tag, object, query) rewrites values of
    the captured ``table`` (schema.table) with no row change in the log; "" if it does not."""
    stmts = _statements(carried.get("query") or "")
    obj = carried.get("object") or ""
    if carried.get("tag") == "ALTER TYPE":
        type_name = _name_at(_statements(obj)[0], 0)[0] if _statements(obj) else obj
        shown = list(_altered(stmts, "TYPE", type_name)) or _renamed_to(stmts, type_name)
        for rest in shown:
            action = tuple(_word(t) for t in rest[:2])
            if action not in _KEEPS_VALUES:
                return (f"type {obj}, which its columns use, was altered ({' '.join(action)}): the text of the "
                        "values stored in them may have changed, with no row change in the log")
        return "" if shown else (f"type {obj}, which its columns use, was altered by a statement the log's text "
                                 "does not show (dynamic SQL): its values may have changed")
    name = table.partition(".")[2]
    shown = list(_altered(stmts, "TABLE", name))
    for rest in shown:
        for clause in _clauses(rest):
            column = _using_column(clause)
            if column:
                return (f"column {column} was rewritten by ALTER COLUMN ... TYPE ... USING: its values changed "
                        "with no row change in the log")
    if not shown and _MAY_REWRITE.search(carried.get("query") or ""):
        return ("it was altered by a statement the log's text does not show (dynamic SQL) that may rewrite "
                    "a column (TYPE ... USING)")
    return ""
