"""A PostgreSQL target's checkpoints of many tables at once (an apply run's survey,
engine/apply_survey.py): which target tables exist and where each is applied to, in one
read; the checkpoints of tables with nothing to apply moved forward in one transaction,
under each table's advisory lock as ``advance_applied`` takes it one table at a time.
No Spark and no Airflow here.
"""
from __future__ import annotations

from psycopg2 import sql
from psycopg2.extras import execute_values

from ..positions import Position
from ..schema import TableSchema
from .pg_tables import STATE_TABLE, qualified_name, qualified_text, source_table_name, target_table_name


def lock_key(database: str, schema: str, table: TableSchema | str) -> str:
    """The text of a target table's advisory lock (every apply step on the table takes it)."""
    return f"dblog-apply|{database}|{schema}|{target_table_name(table)}"


def read(cur, schema: str, source: str, tables: list[str]) -> dict[str, tuple[bool, Position | None]]:
    """{table: (its target table exists, its applied position or None)} in two statements."""
    cur.execute("SELECT n, to_regclass(n) IS NOT NULL FROM unnest(%s::text[]) AS n",
                ([qualified_text(schema, target_table_name(t)) for t in tables],))
    exists = dict(cur.fetchall())
    applied: dict[str, Position] = {}
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified_text(schema, STATE_TABLE),))
    if cur.fetchone()[0]:
        cur.execute(sql.SQL("SELECT table_name, pos FROM {} WHERE source = %s AND table_name = ANY(%s)").format(
            qualified_name(schema, STATE_TABLE)), (source, [source_table_name(t) for t in tables]))
        applied = {t: Position.decode(p) for t, p in cur.fetchall()}
    return {t: (exists[qualified_text(schema, target_table_name(t))], applied.get(source_table_name(t))) for t in tables}


def advance(cur, database: str, schema: str, source: str, tables: dict[str, Position], pos: Position) -> int:
    """Move the checkpoints of ``tables`` (no rows, no change of shape) forward to ``pos``,
    each only from the position given for it ({table: applied}, as :func:`read` found it),
    never back: how many moved. A checkpoint another run moved or removed meanwhile (it
    applied the table, or forgot the checkpoint to re-apply it from the start: a target
    table dropped by hand) stays as that run left it. The locks are taken in one order (no
    two such runs deadlock)."""
    if not tables:
        return 0
    cur.execute("SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) "
                "FROM (SELECT k FROM unnest(%s::text[]) AS k ORDER BY k) AS keys",
                (sorted({lock_key(database, schema, t) for t in tables}),))
    rows = [(source, source_table_name(t), was.encode(), pos.encode()) for t, was in tables.items()]
    execute_values(cur, sql.SQL(
        "UPDATE {} AS s SET pos = v.pos, applied_at = now() FROM (VALUES %s) AS v (source, table_name, was, pos) "
        "WHERE s.source = v.source AND s.table_name = v.table_name AND s.pos = v.was "
        "AND s.pos < v.pos").format(qualified_name(schema, STATE_TABLE)).as_string(cur),
        rows, template="(%s, %s, %s, %s)", page_size=len(rows))
    return cur.rowcount
