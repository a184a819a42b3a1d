"""A PostgreSQL apply target: one table per captured source table, merged by position.

Source table ``shop.orders`` lands in ``"<schema>"."shop__orders"``: the source's
columns (typed by ``Column.postgres_type``), its primary key, and ``_dblog_pos``,
the position of the event that wrote the row. ``"<schema>".dblog_apply_state``
holds, per (source, table), the position below which every event has been
applied: the apply's checkpoint, moved in the same transaction as the rows.

A batch is staged in a plain table (``COPY``, engine/targets/pg_copy.py; names in
engine/targets/pg_tables.py) and merged in one transaction that takes an advisory lock
per target table (two applies never interleave); ignores stage rows below the checkpoint
(a replayed or stale batch changes nothing, nor brings back a row a later batch deleted);
keeps the latest stage row per key; deletes, inserts or updates a row only when the event
is newer than the row (invariant 1); moves the checkpoint forward only, and takes a change
of the table's shape there (engine/targets/pg_evolve.py).

Identifiers are always quoted with ``psycopg2.sql.Identifier``; values are bound.
No Spark and no Airflow here.
"""
from __future__ import annotations

import logging

import psycopg2
import psycopg2.errors
import pyarrow as pa
from psycopg2 import sql

from ..config import TargetConfig
from ..positions import Position
from ..arrow_values import to_arrow
from ..schema import TableSchema
from ..values import comparable_key, pg_options
from . import pg_checkpoint, pg_read
from .base import MergeResult
from .pg_copy import copy_rows
from .pg_errors import is_transient
from .pg_evolve import evolve_table, table_columns
from .pg_stage import stage_and_merge
from .pg_tables import (OP_COLUMN, POS_COLUMN, STAGE_PREFIX, STATE_TABLE, dblog_tables, from_row, json_as_text, qualified_name,
                        qualified_text, read_list, source_table_name, target_table_name)

log = logging.getLogger(__name__)


class PostgresTarget:  # implements targets.base.Target
    is_transient = staticmethod(is_transient)  # the server away (retry), or a fault of the request

    def __init__(self, config: TargetConfig, connect_timeout: int = 10):
        self.config = config
        self.schema = config.schema
        self.database = config.endpoint.database or "postgres"
        self.connect_timeout = connect_timeout
        self._conn = None

    # -- connections -----------------------------------------------------------
    def _connect(self, database: str):
        ep = self.config.endpoint
        conn = psycopg2.connect(host=ep.host, port=ep.port, user=ep.user, password=ep.password,
                                dbname=database, connect_timeout=self.connect_timeout,
                                application_name="dblog-apply", options=pg_options())
        json_as_text(conn)
        return conn

    def ensure_database(self) -> bool:
        """Create the target database if it is missing; True if it was created."""
        try:
            self._connect(self.database).close()
            return False
        except psycopg2.OperationalError as e:
            if "does not exist" not in str(e):
                raise
        admin = self._connect("postgres")
        try:
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone():
                    return False
                try:
                    cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
                except psycopg2.errors.DuplicateDatabase:  # created concurrently
                    return False
                log.info("created target database %s", self.database)
                return True
        finally:
            admin.close()

    @property
    def conn(self):
        if self._conn is None or self._conn.closed:
            self.ensure_database()
            self._conn = self._connect(self.database)
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    def __enter__(self) -> "PostgresTarget":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def jdbc(self) -> tuple[str, dict[str, str]]:
        """URL and properties for Spark's JDBC writer (PostgreSQL JDBC driver)."""
        ep = self.config.endpoint
        url = f"jdbc:postgresql://{ep.host}:{ep.port}/{self.database}?reWriteBatchedInserts=true"
        return url, {"driver": "org.postgresql.Driver", "user": ep.user, "password": ep.password,
                     "stringtype": "unspecified", "batchsize": "5000"}

    # -- names -------------------------------------------------------------------
    def _tid(self, name: str) -> sql.Composed:
        return qualified_name(self.schema, name)

    def qualified_stage(self, stage: str) -> str:
        """The stage's name as SQL text (quoted), for Spark's ``dbtable`` option."""
        return qualified_text(self.schema, stage)

    # -- DDL -----------------------------------------------------------------------
    def _ensure_schema(self, cur) -> None:
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " source text NOT NULL,"
            " table_name text NOT NULL,"
            " pos text COLLATE \"C\" NOT NULL,"
            " applied_at timestamptz,"
            " PRIMARY KEY (source, table_name))").format(self._tid(STATE_TABLE)))

    def _table_exists(self, cur, name: str) -> bool:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (self.qualified_stage(name),))
        return bool(cur.fetchone()[0])

    # every shape a source gives is a PostgreSQL table's (logical_types.postgres_type)
    holds_every_shape = True

    def check_table(self, table: TableSchema, names: list[str] | None = None) -> None:
        """Nothing to refuse: ``holds_every_shape``."""

    def ensure_table(self, table: TableSchema) -> bool:
        """Create the target table (and the checkpoint table) if it does not exist, under
        the table's advisory lock (concurrent first applies do not race); True if created.
        Every column but the key's is nullable. Later shapes: :func:`pg_evolve.evolve_table`."""
        name = target_table_name(table)
        cols = [sql.SQL("{} {}{}").format(
                    sql.Identifier(c.name), sql.SQL(c.postgres_type),
                    sql.SQL(" NOT NULL" if c.name in table.key else ""))
                for c in table.columns]
        cols.append(sql.SQL("{} text COLLATE \"C\" NOT NULL").format(sql.Identifier(POS_COLUMN)))
        cols.append(sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in table.key)))
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            self._ensure_schema(cur)
            existed = self._table_exists(cur, name)
            if not existed:
                cur.execute(sql.SQL("CREATE TABLE {} ({})").format(
                    self._tid(name), sql.SQL(", ").join(cols)))
                log.info("created target table %s.%s", self.schema, name)
        return not existed

    def columns(self, table: TableSchema | str) -> list[str]:
        """The target table's columns ([] when it does not exist)."""
        with self.conn, self.conn.cursor() as cur:
            return table_columns(cur, self.qualified_stage(target_table_name(table)))

    def _evolve(self, cur, table: TableSchema, evolve: tuple | None) -> None:
        if evolve is not None:   # the table's change of shape at the checkpoint just moved
            evolve_table(cur, self._tid(target_table_name(table)), self.qualified_stage(target_table_name(table)),
                         *evolve)

    def drop_table(self, table: TableSchema) -> None:
        """Drop the target table (a quarantined table rebuilt in its new shape: engine/quarantine.py)."""
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._tid(target_table_name(table))))

    def create_stage(self, table: TableSchema, stage: str) -> None:
        """An empty stage table typed like the target (no constraints), for Spark to append to.

        Pre-creating it keeps the types exact (numeric(p,s), timestamp(6), bytea, ...)
        instead of whatever Spark's JDBC dialect would pick.
        """
        cols = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.postgres_type))
                for c in table.columns]
        cols.append(sql.SQL("{} text NOT NULL").format(sql.Identifier(OP_COLUMN)))
        cols.append(sql.SQL("{} text COLLATE \"C\" NOT NULL").format(sql.Identifier(POS_COLUMN)))
        with self.conn, self.conn.cursor() as cur:
            self._ensure_schema(cur)
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._tid(stage)))
            cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(
                self._tid(stage), sql.SQL(", ").join(cols)))

    def drop_stage(self, stage: str) -> None:
        if not stage.startswith(STAGE_PREFIX):
            raise ValueError(f"{stage!r} is not a stage table")
        with self.conn, self.conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._tid(stage)))

    # -- checkpoint ----------------------------------------------------------------
    def _lock(self, cur, table: TableSchema | str) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (pg_checkpoint.lock_key(self.database, self.schema, table),))

    def _applied(self, cur, source: str, table: TableSchema | str) -> Position | None:
        if not self._table_exists(cur, STATE_TABLE):
            return None
        cur.execute(sql.SQL("SELECT pos FROM {} WHERE source = %s AND table_name = %s").format(
            self._tid(STATE_TABLE)), (source, source_table_name(table)))
        row = cur.fetchone()
        return Position.decode(row[0]) if row else None

    def applied_pos(self, source: str, table: TableSchema | str) -> Position | None:
        """Every event of ``table`` below this position has been applied (None: nothing yet)."""
        with self.conn, self.conn.cursor() as cur:
            return self._applied(cur, source, table)

    def _advance(self, cur, source: str, table: TableSchema | str, pos: Position) -> bool:
        cur.execute(sql.SQL(
            "INSERT INTO {t} AS s (source, table_name, pos, applied_at) VALUES (%s, %s, %s, now()) "
            "ON CONFLICT (source, table_name) DO UPDATE SET pos = EXCLUDED.pos, applied_at = EXCLUDED.applied_at "
            "WHERE s.pos < EXCLUDED.pos").format(t=self._tid(STATE_TABLE)),
            (source, source_table_name(table), pos.encode()))
        return cur.rowcount == 1

    def advance_applied(self, source: str, table: TableSchema | str, pos: Position,
                        evolve: tuple | None = None) -> bool:
        """Move the checkpoint forward without rows (an empty batch), and take ``evolve``
        (an Evolution and the new shape) if it moved. Never moves it back."""
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            self._ensure_schema(cur)
            if moved := self._advance(cur, source, table, pos):
                self._evolve(cur, table, evolve)
            return moved

    # many tables at once (base.checkpoints / base.advance_applied_many): pg_checkpoint.py
    def checkpoints(self, source: str, tables: list[str]) -> dict[str, tuple[bool, Position | None]]:
        with self.conn, self.conn.cursor() as cur:
            return pg_checkpoint.read(cur, self.schema, source, tables)

    def advance_applied_many(self, source: str, tables: dict[str, Position], pos: Position) -> int:
        with self.conn, self.conn.cursor() as cur:
            self._ensure_schema(cur)
            return pg_checkpoint.advance(cur, self.database, self.schema, source, tables, pos)

    def reset_applied(self, source: str, table: TableSchema | str) -> None:
        """Forget the checkpoint (the target table was recreated empty: re-apply from the start)."""
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            self._ensure_schema(cur)
            cur.execute(sql.SQL("DELETE FROM {} WHERE source = %s AND table_name = %s").format(
                self._tid(STATE_TABLE)), (source, source_table_name(table)))

    # -- the merge -------------------------------------------------------------------
    def merge_batch(self, table: TableSchema, pages, source: str, new_pos: Position, run_id: str,
                    evolve: tuple | None = None) -> MergeResult:
        """The contract's merge (base.py): staged with COPY, merged in one transaction (pg_stage.py)."""
        return stage_and_merge(self, table, pages, source, new_pos, run_id, evolve)

    def merge_from_stage(self, table: TableSchema, stage: str, source: str, new_pos: Position,
                         drop_stage: bool = False, evolve: tuple | None = None) -> MergeResult:
        """Merge a staged batch in one transaction and move the checkpoint to ``new_pos``
        (and take ``evolve`` there: :meth:`advance_applied`).

        The stage holds the table's columns plus ``_dblog_op`` and ``_dblog_pos``
        (for a delete, the key columns of its before image). Stage rows below the
        checkpoint are ignored; of the rest the latest per key counts, and it
        changes a target row only if its position is newer than the row's.
        """
        tgt = self._tid(target_table_name(table))
        stg = self._tid(stage)
        cols = [sql.Identifier(c) for c in table.column_names]
        keys = [sql.Identifier(k) for k in table.key]
        non_keys = [sql.Identifier(c) for c in table.column_names if c not in table.key]
        pos, op = sql.Identifier(POS_COLUMN), sql.Identifier(OP_COLUMN)
        key_list = sql.SQL(", ").join(keys)
        key_match = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = l.{k}").format(k=k) for k in keys)
        updates = sql.SQL(", ").join(   # the key too: an equal key written otherwise (numeric: 2, 2.00)
            [sql.SQL("{c} = EXCLUDED.{c}").format(c=c) for c in keys + non_keys]
            + [sql.SQL("{p} = EXCLUDED.{p}").format(p=pos)])
        col_list = sql.SQL(", ").join(cols + [pos])
        # One statement: data-modifying CTEs share a snapshot, and the deleted and
        # upserted keys are disjoint (a key's latest stage row is one or the other).
        merge = sql.SQL("""
            WITH latest AS (
                SELECT DISTINCT ON ({key_list}) *
                FROM {stg}
                WHERE {pos} >= %(floor)s
                ORDER BY {key_list}, {pos} DESC
            ), del AS (
                DELETE FROM {tgt} AS t USING latest AS l
                WHERE l.{op} = 'delete' AND {key_match} AND t.{pos} < l.{pos}
                RETURNING 1
            ), ups AS (
                INSERT INTO {tgt} AS t ({col_list})
                SELECT {col_list} FROM latest WHERE {op} <> 'delete'
                ON CONFLICT ({key_list}) DO UPDATE SET {updates}
                WHERE t.{pos} < EXCLUDED.{pos}
                RETURNING (xmax = 0) AS inserted
            )
            SELECT (SELECT count(*) FROM latest),
                   (SELECT count(*) FROM ups WHERE inserted),
                   (SELECT count(*) FROM ups WHERE NOT inserted),
                   (SELECT count(*) FROM del)
        """).format(key_list=key_list, stg=stg, pos=pos, tgt=tgt, op=op, key_match=key_match,
                    col_list=col_list, updates=updates)
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            self._ensure_schema(cur)
            applied = self._applied(cur, source, table)
            floor = applied.encode() if applied is not None else ""
            cur.execute(merge, {"floor": floor})
            staged, inserted, updated, deleted = (int(v) for v in cur.fetchone())
            if moved := self._advance(cur, source, table, new_pos):
                self._evolve(cur, table, evolve)
            if drop_stage:
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stg))
        res = MergeResult(inserted=inserted, updated=updated, deleted=deleted,
                          stale=staged - inserted - updated - deleted, staged=staged,
                          checkpoint_moved=moved)
        log.info("merged %s into %s.%s: %s", stage, self.schema, target_table_name(table), res)
        return res

    # -- reading (tests, verification): pg_read.py -------------------------------------
    rows = pg_read.rows
    read_at = pg_read.read_at

    def delete_orphans(self, table: TableSchema, source: str, keep, below: Position,
                       until: Position, in_source=None, before_delete=None) -> int | None:
        """Delete the rows a full-table dump proved absent from the source: ``_dblog_pos``
        below ``below`` and key not in ``keep`` (an Arrow table of the key columns).
        Only once every event below ``until`` is applied, checked under the table's lock;
        None (nothing done) before that. See ``engine/sweep.py`` for why this is exact.

        ``in_source(keys) -> set``: which of the candidate keys (logical values) the source
        holds now, as ``values.comparable_key`` tuples; those stay. (A commit the source had
        logged but not yet made visible when the dump read its bounds would otherwise be
        taken for an orphan: the check makes the sweep safe whatever the commit order.)"""
        name = self._tid(target_table_name(table))
        keys = [sql.Identifier(k) for k in table.key]
        match = sql.SQL(" AND ").join(sql.SQL("k.{k} = t.{k}").format(k=k) for k in keys)
        with self.conn, self.conn.cursor() as cur:
            self._lock(cur, table)
            applied = self._applied(cur, source, table)
            if applied is None or applied < until:
                return None
            # typed exactly like the target's key columns
            for temp in ("_dblog_keep", "_dblog_gone"):
                cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                            .format(sql.Identifier(temp), sql.SQL(", ").join(keys), name))
            copy_rows(cur, sql.Identifier("_dblog_keep"), keep.select(list(table.key)))
            cur.execute("ANALYZE _dblog_keep")
            cur.execute(sql.SQL(
                "SELECT {} FROM {} AS t WHERE t.{pos} < %s AND NOT EXISTS "
                "(SELECT 1 FROM _dblog_keep AS k WHERE {match})").format(
                    read_list(table, list(table.key), "t"), name, pos=sql.Identifier(POS_COLUMN),
                    match=match), (below.encode(),))
            candidates = [from_row(table, list(table.key), r) for r in cur.fetchall()]
            if candidates and in_source is not None:
                there = in_source(candidates)
                candidates = [k for k in candidates
                              if tuple(comparable_key(t, v) for t, v in zip(table.key_types, k)) not in there]
                if there:
                    log.warning("%s: %d candidate orphan(s) are in the source after all (a commit "
                                "logged before the dump's bounds but not yet visible): kept",
                                table.qualified, len(there))
            if not candidates:
                return 0
            gone = pa.table({k: to_arrow(t, [c[i] for c in candidates])
                             for i, (k, t) in enumerate(zip(table.key, table.key_types))})
            copy_rows(cur, sql.Identifier("_dblog_gone"), gone)
            cur.execute(sql.SQL("DELETE FROM {} AS t USING _dblog_gone AS k WHERE t.{pos} < %s AND {match}")
                        .format(name, pos=sql.Identifier(POS_COLUMN), match=match), (below.encode(),))
            return cur.rowcount

    def count(self, table: TableSchema | str) -> int:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(self._tid(target_table_name(table))))
            return int(cur.fetchone()[0])

    def exists(self, table: TableSchema | str) -> bool:
        with self.conn, self.conn.cursor() as cur:
            return self._table_exists(cur, target_table_name(table))

    # its Asset is the source table's (assets.table_asset); a SQL table has no versions
    uri = version = staticmethod(lambda table: None)

    def drop_all(self) -> list[str]:
        """Drop every table this target created in its schema (tests, demo resets): only
        dblog's own (``pg_tables.dblog_tables``). The schema itself stays."""
        with self.conn, self.conn.cursor() as cur:
            names = dblog_tables(cur, self.schema)
            for n in names:
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(self._tid(n)))
        return names
