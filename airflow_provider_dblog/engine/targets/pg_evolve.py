"""A PostgreSQL target table takes a change of its source table's shape
(engine/schema_evolution.py), inside the transaction that moves its checkpoint to the
change: its shape is always the one holding at its checkpoint.

Every step is written to be right when it finds the table already partly changed (a
behaviour switched between changes, a column dropped at the source and added again):
identifiers are quoted, types come from the logical types, nothing else is pasted.
No Spark and no Airflow here.
"""
from __future__ import annotations

import logging

import pyarrow as pa
from psycopg2 import sql

from ..arrow_values import decode_row
from ..schema import TableSchema
from ..schema_evolution import Evolution
from .pg_copy import copy_rows

log = logging.getLogger(__name__)


def table_columns(cur, regclass: str) -> list[str]:
    """The target table's columns, in order ([] when it does not exist)."""
    cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum", (regclass,))
    return [r[0] for r in cur.fetchall()]


def fill_literal(cur, column: str, pg_type: str, fills: pa.Table) -> sql.Composable:
    """The SQL literal of ``column``'s value in ``fills`` (a one-row Arrow table), typed: the
    value goes through ``COPY`` as every staged value does, and comes back as PostgreSQL's
    own quoted text of it, so the literal is exact and nothing is pasted from a value."""
    cur.execute(sql.SQL("CREATE TEMP TABLE _dblog_fill ({} {}) ON COMMIT DROP").format(
        sql.Identifier(column), sql.SQL(pg_type)))
    copy_rows(cur, sql.Identifier("_dblog_fill"), fills.select([column]))
    cur.execute(sql.SQL("SELECT quote_nullable({}::text) FROM _dblog_fill").format(sql.Identifier(column)))
    literal = cur.fetchone()[0]
    cur.execute("DROP TABLE _dblog_fill")
    return sql.SQL("{}::{}").format(sql.SQL(literal), sql.SQL(pg_type))


def evolve_table(cur, tid: sql.Composable, regclass: str, ev: Evolution, new: TableSchema) -> list[str]:
    """Change the target table as ``ev`` says (``new``: the source's shape after it); the
    statements' descriptions."""
    have = set(table_columns(cur, regclass))
    done: list[str] = []

    def run(statement: sql.Composable, what: str) -> None:
        cur.execute(statement)
        done.append(what)

    col = sql.Identifier
    if ev.truncate:   # every row is below the checkpoint, which is the TRUNCATE's position
        run(sql.SQL("TRUNCATE {}").format(tid), "truncate")
    for a, b in ev.rename:
        if b in have:   # a column kept from an earlier change holds the name: the rename wins
            run(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(tid, col(b)), f"drop {b}")
        if a in have:
            run(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(tid, col(a), col(b)), f"rename {a} to {b}")
            have = (have - {a}) | {b}
    for c in ev.drop:
        if c in have:
            run(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(tid, col(c)), f"drop {c}")
            have.discard(c)
    for c, logical in ev.retype:
        if c in have:
            t = new.column(c).postgres_type
            run(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(tid, col(c), sql.SQL(t)), f"{c} to {t}")
    fills = decode_row(ev.fill_values) if ev.fill else None
    for c in ev.add:
        t = new.column(c).postgres_type
        value = fill_literal(cur, c, t, fills) if c in ev.fill else sql.SQL("NULL")
        if c in have:   # kept from a drop, added again at the source: existing rows hold its default
            run(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}").format(tid, col(c), sql.SQL(t), value),
                f"{c} reset")
        elif c in ev.fill:   # a constant default: PostgreSQL gives existing rows the value without a rewrite
            run(sql.SQL("ALTER TABLE {} ADD COLUMN {} {} DEFAULT {}").format(tid, col(c), sql.SQL(t), value),
                f"add {c} {t} filled")
            run(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(tid, col(c)), f"{c} no default")
        else:
            run(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(tid, col(c), sql.SQL(t)), f"add {c} {t}")
        have.add(c)
    for a, b in ev.copy:   # lenient rename: the new column holds the old one's values, the old one stays
        if b not in have:
            run(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(tid, col(b), sql.SQL(new.column(b).postgres_type)),
                f"add {b}")
            have.add(b)
        if a in have:
            run(sql.SQL("UPDATE {} SET {} = {}").format(tid, col(b), col(a)), f"{b} = {a}")
    if done:
        log.info("target table %s: %s (%s)", regclass, "; ".join(done), ev.describe())
    return done
