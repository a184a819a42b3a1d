"""The shape a MariaDB/MySQL table had right after an ALTER TABLE when the catalog is
already past it (the tail was stopped or behind while later ALTERs ran, as a migration's
back-to-back statements do): the server itself computes it.

The table as it was before the statement (its SHOW CREATE TABLE, kept with each schema
version) is created again under a scratch name in dblog's own database (the watermark
namespace, where the source's user may create tables), the statement is run on it (its
own text, only the table's name replaced, token by token), and the scratch table's
catalog is the shape; the scratch table is dropped. Foreign key checks are off in that
session, and the binlog too where the user may turn it off (``sql_log_bin``); where not,
the scratch statements are in the log for a table no source captures. Any failure
(a statement the scratch table cannot take) leaves the table quarantined as before.

Nothing here imports Airflow.
"""
from __future__ import annotations

import logging
import re
import uuid
from typing import Callable

import pymysql
import sqlglot
from sqlglot.errors import SqlglotError

from .sql import quote_ident, quote_table, unquote_ident

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "_dblog_shape_"
_CREATE = re.compile(r"^\s*CREATE\s+TABLE\s+`(?:[^`]|``)+`", re.IGNORECASE)


def _name_tokens(text: str):
    """The tokens of an ALTER [ONLINE|IGNORE] TABLE statement's table name, or None."""
    try:
        tokens = sqlglot.Dialect.get_or_raise("mysql").tokenize(text)
    except SqlglotError:
        return None
    words = [t.text.upper() for t in tokens[:4]]
    if not words or words[0] != "ALTER":
        return None
    i = 1 + (words[1:2] in (["ONLINE"], ["IGNORE"]))
    if words[i:i + 1] != ["TABLE"]:
        return None
    i += 1
    if i < len(tokens) and tokens[i].text.upper() == "IF":   # IF EXISTS
        i += 2
    end = i + 3 if i + 2 < len(tokens) and tokens[i + 1].text == "." else i + 1
    return tokens[i:end]


def alter_on(statement: str, default_db: str, table: str, scratch: str) -> str | None:
    """``statement`` (an ALTER TABLE of ``table``, "db.name") with the table's name replaced
    by ``scratch`` (a quoted qualified name); None when it is not such a statement."""
    name = _name_tokens(statement)
    if not name:
        return None
    parts = [unquote_ident(t.text) if t.token_type.name != "IDENTIFIER" else t.text for t in name[::2]]
    db, short = (parts[0], parts[1]) if len(parts) == 2 else (default_db, parts[0])
    if f"{db}.{short}" != table:
        return None
    # a quoted identifier's token spans its text without the backticks: widen to them
    start, end = name[0].start, name[-1].end + 1
    if start > 0 and statement[start - 1] == "`":
        start -= 1
    if end < len(statement) and statement[end] == "`":
        end += 1
    return statement[:start] + scratch + statement[end:]


def replay_alter(connect: Callable[[], pymysql.connections.Connection], namespace: str, table: str,
                 create: str, statement: str, default_db: str, read: Callable[[Callable, str], object],
                 sql_mode: int | None = None):
    """The catalog of ``table`` right after ``statement``, computed on a scratch copy made
    from ``create`` (its SHOW CREATE TABLE before it): ``read(query, scratch_table)`` of
    the scratch table (catalog.read_table), or None when it cannot be computed."""
    if not create or not _CREATE.match(create):
        return None
    scratch = f"{namespace}.{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}"
    alter = alter_on(statement, default_db, table, quote_table(scratch))
    if alter is None:
        return None
    conn = connect()
    try:
        with conn.cursor() as cur:
            def query(sql, args=None):
                cur.execute(sql, args)
                return list(cur.fetchall())
            try:
                cur.execute("SET SESSION sql_log_bin = 0")
            except pymysql.MySQLError:
                pass   # no privilege: the scratch statements are logged, for a table nobody captures
            cur.execute("SET SESSION foreign_key_checks = 0")
            if sql_mode is not None:   # the statement's own (its binlog event's)
                cur.execute("SET SESSION sql_mode = %s", (int(sql_mode),))
            # dblog's database exists once a dump opened a window: before, it is made here
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote_ident(namespace)}")
            cur.execute(_CREATE.sub(f"CREATE TABLE {quote_table(scratch)}", create, count=1))
            try:
                cur.execute(alter)
                found = read(query, scratch)
            finally:
                cur.execute(f"DROP TABLE IF EXISTS {quote_table(scratch)}")
        return found
    except pymysql.MySQLError as e:
        log.warning("%s: the shape after %r could not be computed on a scratch table (%s)", table,
                    statement[:200], e)
        return None
    finally:
        conn.close()


def scratch_name_in(create: str, table: str) -> str:
    """``create`` (a scratch table's SHOW CREATE TABLE) naming ``table``'s short name again."""
    return _CREATE.sub(f"CREATE TABLE {quote_ident(table.partition('.')[2])}", create, count=1)


def defined_elsewise(defined, found, catalog) -> bool:
    """A TIMESTAMP column the statement defines (``defined``) has another type,
    nullability or default on the scratch copy (``found``) than in the catalog
    (``catalog``, a CapturedTable): the statement's session may have given it another
    shape than the scratch session does (explicit_defaults_for_timestamp, time_zone: the
    binlog carries the sql_mode only), or a later statement changed it; the copy is not
    known to be right, and the table is quarantined as before. (Other types take their
    shape from the statement and the sql_mode alone.)"""
    nullable = {c.name: c.nullable for c in catalog.schema.columns}
    for name in defined:
        c = next((c for c in found.schema.columns if c.name.lower() == name.lower()), None)
        if c is None or c.name not in catalog.native or "timestamp" not in (
                found.native[c.name].data_type, catalog.native[c.name].data_type):
            continue   # dropped or renamed since (only the copy can say), or not session-dependent
        if (found.native[c.name].column_type, c.nullable, found.defaults.get(c.name)) != (
                catalog.native[c.name].column_type, nullable[c.name], catalog.defaults.get(c.name)):
            return True
    return False
