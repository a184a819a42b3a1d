"""PostgreSQL source: the Source of sources/base.py over psycopg2 (and Spark's JDBC
reader): table shapes, key-range chunk planning, bound-parameter key lookups and the
change log's entry points. It delegates by concern within this package: catalog.py
(table shapes), column_types.py (types and value forms), sql.py (quoting and
literals), checks.py (set-up checks), watermarks.py (watermark writes), slot.py and
stream.py (the log: a logical replication slot read with pgoutput).

Positions are (0, commit LSN, change index within the transaction).

Every statement runs in autocommit with its values bound (``%s``) and its
identifiers quoted (sql.py). Every session prints with ``values.PG_TEXT_SETTINGS``,
whatever the server's defaults.

Nothing here imports Airflow.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import psycopg2
import psycopg2.extensions

import pyarrow as pa

from ...conditions import parse_condition
from ...config import SourceConfig
from ...positions import Position
from ...schema import TableSchema
from ...values import pg_options, pg_set_statements
from ..base import ChunkPlan, LogItem
from ..sql_source import SELECT_BATCH, SqlSource, raw_key_alias
from .catalog import (catalog_identity, catalog_oids, key_deferrable_now, load_table, partition_roots,
                      retyped_as_logged)
from . import key_texts
from .checks import SetupChecks
from .column_types import NativeColumn, needs_expr, select_expr, text_converter, text_parsed, to_logical
from .lsn import lsn_to_int
from .slot import SlotAndPublication
from .sql import (BoundParams, bound_ident, key_after, key_upto, pg_literal, quote_ident, quote_table,
                  row_expr, table_stmt)
from .stream import LogStream
from .watermarks import WatermarkWrites

JDBC_DRIVER = "org.postgresql.Driver"
# standard_conforming_strings: range_predicates' literals never use backslash escapes
# (a bytea literal is '\x..'), so they must be read as written
JDBC_SESSION_INIT = ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; "
                     + pg_set_statements())


class PostgresSource(SetupChecks, WatermarkWrites, SqlSource):
    """A PostgreSQL source of the DBLog engine (see sources/base.py Source)."""

    to_logical = staticmethod(to_logical)
    needs_expr = staticmethod(needs_expr)
    text_parsed = staticmethod(text_parsed)
    dialect = "postgres"
    native_type = NativeColumn
    value_errors = (psycopg2.DataError,)
    driver_error = psycopg2.Error
    definition_grant = "grant USAGE on the schema and SELECT on the table"
    quote_table = staticmethod(quote_table)
    canonical_keys = key_texts.canonical_keys   # a requested key's text, and keys equal by value
    equal_keys = key_texts.equal_keys

    def __init__(self, config: SourceConfig):
        super().__init__(config)
        self._replident: dict[str, str] = {}
        self._deferrable: dict[str, bool] = {}
        self._defaults: dict[str, dict[str, str]] = {}
        self._attnums: dict[str, dict[str, int]] = {}
        self._oid: dict[str, int] = {}
        self._slot: SlotAndPublication | None = None

    def __repr__(self) -> str:
        ep = self.config.endpoint
        return f"PostgresSource({self.name!r}, {ep.user}@{ep.host}:{ep.port}/{ep.database})"

    # -- connections -------------------------------------------------------------
    def _connect(self) -> psycopg2.extensions.connection:
        ep = self.config.endpoint
        conn = psycopg2.connect(host=ep.host, port=int(ep.port), user=ep.user,
                                password=ep.password or None, dbname=ep.database or None,
                                connect_timeout=10, application_name="dblog",
                                options=pg_options())
        conn.autocommit = True
        return conn

    def _alive(self, conn):
        """``conn`` if it is open, else a new connection (autocommit: nothing is lost)."""
        if conn is not None and not conn.closed:
            return conn
        return self._connect()

    def _query(self, query: Any, args: Sequence[Any] | None = None, fetch: bool = True) -> list[tuple]:
        with self._lock:
            self._conn = self._alive(self._conn)
            try:
                with self._conn.cursor() as cur:
                    # always with a parameter list, so a %% in the text is always %
                    cur.execute(query, list(args or []))
                    return list(cur.fetchall()) if fetch and cur.description else []
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                if self._conn.closed:   # next call reconnects
                    self._conn = None
                raise

    # -- schemas -----------------------------------------------------------------
    def replica_identity(self, table: str) -> str:
        """pg_class.relreplident as last read: f(ull), d(efault), n(othing), i(ndex)."""
        self.table_schema(table)
        return self._replident[table]

    def key_deferrable(self, table: str) -> bool:
        """Whether the table's primary key is DEFERRABLE (two rows may share a key inside
        a transaction), as last read."""
        self.table_schema(table)
        return self._deferrable[table]

    def _table_extra(self, table: str) -> dict:
        return {"replident": self._replident[table], "deferrable": self._deferrable[table],
                "defaults": self._defaults[table], "attnums": self._attnums.get(table, {}),
                "oid": self._oid.get(table, 0)}

    def _adopt_extra(self, table: str, extra: dict) -> None:
        self._replident[table] = extra.get("replident", "f")
        self._deferrable[table] = bool(extra.get("deferrable"))
        self._defaults[table] = dict(extra.get("defaults") or {})
        self._attnums[table] = dict(extra.get("attnums") or {})
        self._oid[table] = int(extra.get("oid") or 0)

    def key_deferrable_now(self, table: str) -> tuple[bool, str]:
        """(whether the catalog has the table's key DEFERRABLE now, the WAL's end after that read)."""
        return key_deferrable_now(self._query, table)

    def set_key_deferrable(self, table: str, deferrable: bool) -> None:
        """The log reader learned the key's deferrability (stream's log_marks.py): the next
        version recorded (``describe_table``) says so."""
        self.table_schema(table)
        self._deferrable[table] = deferrable

    def partition_roots(self) -> dict[str, list[str]]:
        return partition_roots(self._query, self.tables)

    def table_oid(self, table: str) -> int:
        """The table's pg_class oid as last read or adopted (0: a version that did not record it)."""
        self.table_schema(table)
        return self._oid.get(table, 0)

    def catalog_oids(self, tables) -> dict[str, int]:
        """{table: its oid in the catalog now} of those of ``tables`` that exist."""
        return catalog_oids(self._query, tables)

    def catalog_identity(self, table: str) -> tuple[int | None, dict[str, int]]:
        """(the oid ``table``'s name has in the catalog now, or None; its columns' attnums)."""
        return catalog_identity(self._query, table)

    def retype_as_logged(self, table: str, logged) -> bool:
        """Take the type modifiers of a Relation message's columns (``logged``) into the
        table's shape as last read, when they are all it differs in (catalog.py
        ``retyped_as_logged``); False when it differs in more."""
        with self._lock:
            got = retyped_as_logged(self._query, self.table_schema(table), self.native_columns(table), logged)
            if got is None:
                return False
            self._schemas[table], self._native[table] = got
            return True

    def publish(self, table: str) -> None:
        """Put ``table`` (created again under its name) into the publication, so its changes are
        in the log from here on (the changes before are what the full dump requested fetches)."""
        self.slot.publish([table])

    def added_column_fill(self, table: str, column: str) -> tuple[bool, Any]:
        """What rows that existed when ``column`` was added hold in it: (True, value) when
        PostgreSQL keeps it as ``attmissingval`` (a non-volatile default: the value rows
        older than the column read), parsed as pgoutput's text is; else (False, why)."""
        rows = self._query("SELECT a.atthasmissing, (a.attmissingval::text::text[])[1] FROM pg_attribute a "
                           "WHERE a.attrelid = %s::regclass AND a.attname = %s", (quote_table(table), column))
        if not rows or not rows[0][0]:
            return False, ("PostgreSQL wrote a value into each row (a volatile default, NOT NULL, or a table "
                           "rewrite since): rows may hold different values")
        return True, text_converter(self.native_columns(table)[column])(rows[0][1])

    def _load_schema(self, table: str) -> None:
        schema, native, replident, deferrable, defaults, attnums, oid = load_table(self._query, table, self.name)
        self._schemas[table], self._native[table], self._attnums[table] = schema, native, attnums
        self._oid[table] = oid
        self._replident[table], self._deferrable[table], self._defaults[table] = replident, deferrable, defaults

    # -- chunks ------------------------------------------------------------------
    def _key_types(self, table: TableSchema) -> list[str]:
        native = self.native_columns(table.qualified)
        return [native[k].type_name for k in table.key]

    def _key_exprs(self, table: TableSchema) -> str:
        native = self.native_columns(table.qualified)
        return ", ".join(select_expr(native[k], bound_ident) for k in table.key)

    def _order(self, table: TableSchema, desc: bool = False) -> str:
        """ORDER BY the key columns themselves: a bare name would sort by the output
        column of that name, which select_expr may have made text (9.5 > 10.5)."""
        qt = quote_table(table.qualified).replace("%", "%%")
        return ", ".join(f"{qt}.{bound_ident(k)}{' DESC' if desc else ''}" for k in table.key)

    def max_key(self, table: TableSchema) -> tuple | None:
        desc = self._order(table, desc=True)
        rows = self._query(table_stmt(f"SELECT {self._key_exprs(table)} FROM ONLY ", table.qualified,
                                      f" ORDER BY {desc} LIMIT 1"))
        return self._typed_key(table, rows[0]) if rows else None

    def plan_chunk(self, table: TableSchema, after: tuple | None, upto: tuple, size: int,
                   parts: int) -> ChunkPlan | None:
        """The next at most ``size`` keys with after < key <= upto, split into at most
        ``parts`` partitions of near-equal key counts; one query over the primary key
        (row comparisons, an index range scan)."""
        if size < 1 or parts < 1:
            raise ValueError("size and parts must be at least 1")
        types = self._key_types(table)
        p = BoundParams()
        cond = []
        if after is not None:
            cond.append(key_after(table.key, after, p, types, bound_ident))
        cond.append(key_upto(table.key, upto, p, types, bound_ident))
        keys = ", ".join(bound_ident(k) for k in table.key)
        before = (
            f"SELECT {self._key_exprs(table)}, \"__dblog_cnt\" FROM ("
            f"SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS \"__dblog_rn\", "
            f"count(*) OVER () AS \"__dblog_cnt\" FROM ("
            f"SELECT {keys} FROM ONLY ")
        text = (
            f" WHERE {' AND '.join(cond)} "
            f"ORDER BY {keys} LIMIT %s) AS \"__dblog_chunk\") AS \"__dblog_numbered\" "
            "WHERE \"__dblog_rn\" = \"__dblog_cnt\" "
            "OR (\"__dblog_rn\" * %s) / \"__dblog_cnt\" > ((\"__dblog_rn\" - 1) * %s) / \"__dblog_cnt\" "
            "ORDER BY \"__dblog_rn\"")
        rows = self._query(table_stmt(before, table.qualified, text),
                           p.args + [int(size), int(parts), int(parts)])
        return self._plan_from_rows(table, after, rows)

    def bound_predicate(self, table: TableSchema, cols: list[str], op: str, key: tuple) -> str:
        """``key-columns op key`` for ``range_predicates`` (its literals need
        standard_conforming_strings=on)."""
        bound = key_after if op == ">" else key_upto
        return bound(cols, key, pg_literal, self._key_types(table))

    def select_list(self, table: TableSchema, quote: Callable[[str], str] = quote_ident) -> str:
        native = self.native_columns(table.qualified)
        return ", ".join(select_expr(native[c], quote) for c in table.column_names)

    def select_keys(self, table: TableSchema, keys: Sequence[tuple]) -> pa.Table:
        """The current rows of the given keys (bound parameters, autocommit statements)."""
        types = self._key_types(table)
        cols: dict[str, list] = {c: [] for c in table.column_names}
        keys = list(dict.fromkeys(tuple(k) for k in keys))
        for i in range(0, len(keys), SELECT_BATCH):
            batch = keys[i:i + SELECT_BATCH]
            p = BoundParams()
            if len(table.key) == 1:
                where = (f"{bound_ident(table.key[0])} IN ("
                         + ", ".join(p(k[0], types[0]) for k in batch) + ")")
            else:
                tuples = ["(" + ", ".join(p(v, t) for v, t in zip(k, types)) + ")" for k in batch]
                where = f"{row_expr(table.key, bound_ident)} IN ({', '.join(tuples)})"
            query = table_stmt(f"SELECT {self.select_list(table, bound_ident)} FROM ONLY ", table.qualified,
                               f" WHERE {where}")
            self._append_rows(table, cols, self._query(query, p.args))
        return self._arrow(table, cols)

    def keys_where(self, table: TableSchema, condition: str, limit: int) -> list[tuple]:
        """Keys of the rows matching a user's WHERE condition (parsed strictly, values bound),
        in key order; at most ``limit`` + 1 so the caller can tell it was cut."""
        cond = parse_condition(table, condition, bound_ident)
        query = table_stmt(f"SELECT {self._key_exprs(table)} FROM ONLY ", table.qualified,
                           f" WHERE {cond.sql} ORDER BY {self._order(table)} LIMIT {int(limit) + 1}")
        return [self._typed_key(table, row) for row in self._query(query, list(cond.params))]

    # -- Spark JDBC ----------------------------------------------------------------
    def jdbc(self) -> tuple[str, dict[str, str]]:
        """URL and properties for spark.read.jdbc with the PostgreSQL JDBC driver.

        - sessionInitStatement: READ COMMITTED (no snapshot held across the chunk
          beyond one statement), a UTC session, standard_conforming_strings on (the
          literals of range_predicates).
        - preferTimestampNTZ: timestamp columns (and timestamptz, which jdbc_table
          reads as ``AT TIME ZONE 'UTC'``) read as TIMESTAMP_NTZ.
        - fetchsize: Spark's PostgreSQL dialect turns autocommit off when it is set,
          so the driver streams with a cursor.
        """
        ep = self.config.endpoint
        url = f"jdbc:postgresql://{ep.host}:{int(ep.port)}/{ep.database}"
        props = {
            "driver": JDBC_DRIVER,
            "user": ep.user,
            "password": ep.password,
            "sessionInitStatement": JDBC_SESSION_INIT,
            "fetchsize": "10000",
            "preferTimestampNTZ": "true",
        }
        return url, props

    def jdbc_table(self, table: str | TableSchema) -> str:
        """spark.read.jdbc's ``table``: a derived table of ``ONLY "schema"."table"`` (not
        the rows of tables inheriting from it), some columns read through an expression
        (select_expr: timestamptz, json/jsonb, uuid, time, arrays, unconstrained numeric). A
        key column read through an expression is also selected raw as
        ``raw_key_alias(name)``, which range_predicates use; PostgreSQL pulls the
        sub-select up, so the predicates stay index range scans. Select
        ``table.column_names`` from the result (the aliases are extra columns)."""
        schema = table if isinstance(table, TableSchema) else self.table_schema(table)
        native = self.native_columns(schema.qualified)
        exprs = [select_expr(native[c]) for c in schema.column_names]
        exprs += [f"{quote_ident(k)} AS {quote_ident(raw_key_alias(k))}"
                  for k in schema.key if needs_expr(native[k])]
        # ONLY: the table's own rows, never an inheriting table's (which its log does not carry)
        return f"(SELECT {', '.join(exprs)} FROM ONLY {quote_table(schema.qualified)}) AS \"dblog_chunk\""

    # -- the WAL -------------------------------------------------------------------
    def current_resume(self) -> tuple[Position, dict]:
        """The current end of the WAL: Position(0, LSN, 0) and {"lsn": "X/Y"}."""
        (lsn,), = self._query("SELECT pg_current_wal_lsn()::text")
        return Position(0, lsn_to_int(lsn), 0), {"lsn": str(lsn)}


    @property
    def slot(self) -> SlotAndPublication:
        """The slot and publication (slot.py), made on first use."""
        if self._slot is None:
            self._slot = SlotAndPublication(self)
        return self._slot

    def prepare_log(self) -> None:
        """Create the publication and the replication slot if missing (before the
        tail's first checkpoint, so no change falls between them)."""
        self.slot.prepare()

    def confirm(self, resume: dict) -> None:
        """Everything before ``resume`` is durable: the slot may release it."""
        self.slot.confirm(lsn_to_int(resume["lsn"]))

    def is_transient(self, error: BaseException) -> bool:
        # OperationalError: the server down, restarting or shutting down, the connection cut;
        # a bare DatabaseError without SQLSTATE: the replication stream cut ("no COPY in progress")
        return (isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError))
                or (type(error) is psycopg2.DatabaseError and error.pgcode is None)
                or super().is_transient(error))

    def log_gap(self, resume: dict) -> str | None:
        """The slot is gone (dropped: a new one starts at the WAL's end), or it was moved past
        the checkpoint (pg_replication_slot_advance, another reader): the server would
        stream from the slot's position, not the checkpoint's, skipping what lies between."""
        return self.slot.gap(lsn_to_int(resume["lsn"]))

    def drop_log(self) -> None:
        """Drop the replication slot and the publication (a source taken out of CDC)."""
        self.slot.drop()

    def read_log(self, resume: dict | None, should_stop: Callable[[], bool]) -> Iterator[LogItem]:
        """Row changes of the configured tables, watermark writes, transaction ends and
        Idle, from ``resume`` (a TxnEnd's resume dict; None: the current end of the WAL)
        through the replication slot (stream.py)."""
        if resume is None:
            self.prepare_log()
            _, resume = self.current_resume()
        return LogStream(self, self.slot).read(lsn_to_int(resume["lsn"]), should_stop, self.config.heartbeat_seconds)
