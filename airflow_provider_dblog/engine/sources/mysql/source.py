"""MySQLSource: a MySQL/MariaDB source of the DBLog engine (see sources/base.py
Source). It owns the connections and delegates the rest: table shapes to catalog.py,
values to convert.py, SQL text to sql.py, checks to checks.py, Spark's JDBC options to
jdbc.py and the binlog to binlog.py (or mes_reader.py: ``decoder: mysql-event-stream``).

Values from the binlog and from SELECTs are converted by one function
(``to_logical``) into the table's logical types, so a log event and a chunk row
of the same row are equal. A few native types are selected through an SQL
expression (``select_expr``) so that SELECT, Spark JDBC and the binlog agree:
TIME, DATE, DATETIME, TIMESTAMP and DECIMAL(p>38) as their text (parsed by
engine/values.py: no Java calendar, zero dates caught), FLOAT as the exact DOUBLE,
YEAR and BIT(n>1) as integers.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pymysql
from pymysql.constants import CLIENT

from ...conditions import parse_condition
from ...errors import DBLogError, SourceSetupError, WatermarkError
from ...positions import Position
from ...schema import TableSchema
from ..base import ChunkPlan, LogItem, Problem
from ..sql_source import SELECT_BATCH, SqlSource
from . import checks, key_texts
from .binlog import BinlogReader, CapturedTable, StreamSettings, binlog_file_number
from .catalog import LITERAL_DEFAULT, TRANSACTIONAL_ENGINES, load_decode_tables, read_table
from .convert import key_sql_value, to_logical
from .jdbc import SESSION_TIME_ZONE, jdbc_connection, jdbc_table
from .mes_reader import MesBinlogReader
from .shape_replay import defined_elsewise, replay_alter, scratch_name_in
from .sql import BoundParams, key_predicate, quote_ident, quote_table, sql_literal
from .types import NativeColumn, needs_expr, select_expr, text_parsed

log = logging.getLogger(__name__)

class MySQLSource(SqlSource):
    """A MySQL/MariaDB source of the DBLog engine (see sources/base.py Source)."""

    to_logical = staticmethod(to_logical)
    needs_expr = staticmethod(needs_expr)
    text_parsed = staticmethod(text_parsed)
    dialect = "mysql"
    native_type = NativeColumn
    value_errors = (pymysql.err.DataError,)
    driver_error = pymysql.MySQLError
    quote_table = staticmethod(quote_table)
    canonical_keys = key_texts.canonical_keys   # a TIME key's texts (key_texts.py)

    read_timeout_s = 30.0      # a silent binlog connection is dead after this long

    def __init__(self, config) -> None:
        super().__init__(config)
        self._engines: dict[str, str] = {}
        self._defaults: dict[str, dict[str, str]] = {}
        self._creates: dict[str, str] = {}   # SHOW CREATE TABLE with the shape (shape_replay.py)

    def __repr__(self) -> str:
        ep = self.config.endpoint
        return f"MySQLSource({self.name!r}, {ep.user}@{ep.host}:{ep.port})"

    # -- connections -------------------------------------------------------------
    def _connect(self, **extra) -> pymysql.connections.Connection:
        ep = self.config.endpoint
        return pymysql.connect(host=ep.host, port=int(ep.port), user=ep.user, password=ep.password,
                               charset="utf8mb4", autocommit=True, connect_timeout=10,
                               init_command=f"SET SESSION time_zone='{SESSION_TIME_ZONE}'", **extra)

    def _alive(self, conn, **extra):
        """``conn`` if it still answers, else a new connection (autocommit, so
        nothing is lost by reconnecting between statements)."""
        if conn is not None:
            try:
                conn.ping(False)
                return conn
            except pymysql.MySQLError:
                try:
                    conn.close()
                except Exception:
                    pass
        return self._connect(**extra)

    def _cursor(self):
        self._conn = self._alive(self._conn)
        return self._conn.cursor()

    def _query(self, sql: str, args: Sequence[Any] | None = None) -> list[tuple]:
        with self._lock:
            with self._cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())

    # -- checks ------------------------------------------------------------------
    def server_settings(self) -> dict[str, str]:
        names = ", ".join(f"'{v}'" for v in checks.SERVER_VARIABLES)
        rows = self._query(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
        return {str(k).lower(): str(v) for k, v in rows}

    def setup_problems(self, variables: dict[str, str]) -> list[Problem]:
        """The binlog's settings, the reader's server_id, the user's grants."""
        problems = checks.binlog_problems(variables, self.config.decoder)
        if variables.get("server_id") == str(self.config.server_id):
            problems.append(Problem(
                f"server_id {self.config.server_id} of the CDC reader equals the server's own",
                "set a different server_id for this source in the config"))
        try:
            grants = [r[0] for r in self._query("SHOW GRANTS")]
            problems += checks.privilege_problems(grants)
        except pymysql.MySQLError as e:
            problems.append(Problem(f"cannot read the user's grants: {e}",
                                    "let the user run SHOW GRANTS"))
        if variables.get("log_bin", "").upper() in ("ON", "1") and not any(
                "REPLICATION CLIENT" in p.what for p in problems):
            try:
                self.current_resume()
            except (pymysql.MySQLError, SourceSetupError) as e:
                problems.append(Problem(f"SHOW MASTER STATUS failed: {e}",
                                        "GRANT REPLICATION CLIENT (MariaDB: BINLOG MONITOR) ON *.*"))
        return problems

    def probe_watermark_write(self) -> None:
        self._query(f"UPDATE {quote_table(self.watermark_table)} SET value = value WHERE id = 1 AND 1 = 0")

    def watermark_grant(self) -> str:
        return (f"GRANT CREATE, ALTER, DROP, SELECT, INSERT, UPDATE ON {quote_ident(self.namespace)}.* TO <user>, "
                f"or create the database {self.namespace} for it")

    def probe_select(self, table: str) -> None:
        self._query(f"SELECT 1 FROM {quote_table(table)} LIMIT 0")

    def value_problems(self, table: str) -> list[Problem]:
        """Values of the table that no target can hold exactly (checks.value_problems)."""
        return checks.value_problems(self._query, table, self.table_schema(table),
                                     self.native_columns(table))

    # -- schemas -----------------------------------------------------------------
    def _load_schema(self, table: str) -> None:
        found = read_table(self._query, table, self.name, self.config.zero_dates == "null")
        self._schemas[table] = found.schema
        self._native[table] = found.native
        self._engines[table] = found.engine
        self._defaults[table] = found.defaults
        self._creates[table] = found.create

    def _table_extra(self, table: str) -> dict:
        return {"engine": self._engines.get(table), "defaults": self._defaults.get(table, {}),
                "create": self._creates.get(table, "")}

    def _adopt_extra(self, table: str, extra: dict) -> None:
        self._engines[table] = extra.get("engine")
        self._defaults[table] = dict(extra.get("defaults") or {})
        self._creates[table] = str(extra.get("create") or "")

    def added_column_fill(self, table: str, column: str) -> tuple[bool, Any]:
        """What rows that existed when ``column`` was added hold in it: (True, value) for a
        literal DEFAULT (the server's DEFAULT() of a row, read through the column's select
        expression; no row: nothing to fill), else (False, why)."""
        default = self._defaults.get(table, {}).get(column)
        if default is None or not LITERAL_DEFAULT.fullmatch(default):
            return False, (f"its default {default} is not a constant" if default is not None
                           else "it is NOT NULL without a default (existing rows hold an implicit value)")
        native, q = self.native_columns(table)[column], quote_ident(column)
        db, _, name = table.partition(".")
        try:   # with the catalog's default in the same statement: changed since the ALTER, it is not this one
            expr, q, tbl = (t.replace("%", "%%") for t in (select_expr(native), q, quote_table(table)))
            rows = self._query(f"SELECT {expr}, (SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE "
                               "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND COLUMN_NAME = %s) "
                               f"FROM (SELECT DEFAULT({q}) AS {q} FROM {tbl} LIMIT 1) AS d", (db, name, column))
        except (pymysql.err.ProgrammingError, pymysql.err.OperationalError) as e:
            if e.args and e.args[0] in (1054, 1146):   # the column or table is gone since (the tail is behind)
                return False, f"the server cannot say any more: {e.args[1]}"
            raise
        if rows and str(rows[0][1]) != default:
            return False, f"its default changed again (to {rows[0][1]}) before the value could be read"
        return True, to_logical(native, rows[0][0]) if rows else None

    def transactional(self, table: str) -> bool:
        """Whether the table's engine rolls back (MyISAM, Aria, MEMORY do not: their rows
        stay written when the transaction around them rolls back)."""
        self.table_schema(table)
        return self._engines.get(table) in TRANSACTIONAL_ENGINES

    # -- watermarks --------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        wm = quote_table(self.watermark_table)
        self._query(f"CREATE DATABASE IF NOT EXISTS {quote_ident(self.namespace)}")
        self._query(f"CREATE TABLE IF NOT EXISTS {wm} ("
                    "id TINYINT NOT NULL PRIMARY KEY, "
                    "value CHAR(36) NOT NULL, "
                    "updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
                    ") ENGINE=InnoDB DEFAULT CHARSET=ascii")
        if not self._query(f"SELECT 1 FROM {wm} WHERE id = 1"):
            self._query(f"INSERT IGNORE INTO {wm} (id, value) VALUES (1, '')")

    def write_watermark(self, value: str) -> None:
        """One single-row UPDATE, alone in its own autocommit transaction."""
        if not isinstance(value, str) or not value or len(value) > 36:
            raise ValueError(f"a watermark is a UUID string of at most 36 characters, not {value!r}")
        sql = (f"UPDATE {quote_table(self.watermark_table)} "
               "SET value = %s, updated_at = NOW(6) WHERE id = 1")
        with self._wm_lock:
            self._wm_conn = self._alive(self._wm_conn, client_flag=CLIENT.FOUND_ROWS)
            with self._wm_conn.cursor() as cur:
                n = cur.execute(sql, (value,))
        if n != 1:
            raise WatermarkError(f"watermark row of {self.watermark_table} is missing "
                                 "(run ensure_watermark_table)")

    # -- chunks ------------------------------------------------------------------
    def max_key(self, table: TableSchema) -> tuple | None:
        keys = ", ".join(quote_ident(k) for k in table.key)
        desc = ", ".join(f"{quote_ident(k)} DESC" for k in table.key)
        rows = self._query(f"SELECT {keys} FROM {quote_table(table.qualified)} "
                           f"ORDER BY {desc} LIMIT 1")
        return self._typed_key(table, rows[0]) if rows else None

    def plan_chunk(self, table: TableSchema, after: tuple | None, upto: tuple, size: int,
                   parts: int) -> ChunkPlan | None:
        """The next at most ``size`` keys with after < key <= upto, split into at most
        ``parts`` partitions of near-equal key counts; one query over the primary key."""
        if size < 1 or parts < 1:
            raise ValueError("size and parts must be at least 1")
        p = BoundParams()
        cond = []
        if after is not None:
            cond.append(key_predicate(table.key, ">", self._key_sql(table, after), p))
        cond.append(key_predicate(table.key, "<=", self._key_sql(table, upto), p))
        keys = ", ".join(quote_ident(k) for k in table.key)
        sql = (
            f"SELECT {keys}, `__dblog_cnt` FROM ("
            f"SELECT {keys}, ROW_NUMBER() OVER (ORDER BY {keys}) AS `__dblog_rn`, "
            f"COUNT(*) OVER () AS `__dblog_cnt` FROM ("
            f"SELECT {keys} FROM {quote_table(table.qualified)} WHERE {' AND '.join(cond)} "
            f"ORDER BY {keys} LIMIT %s) AS `__dblog_chunk`) AS `__dblog_numbered` "
            "WHERE `__dblog_rn` = `__dblog_cnt` "
            "OR FLOOR(`__dblog_rn` * %s / `__dblog_cnt`) > FLOOR((`__dblog_rn` - 1) * %s / `__dblog_cnt`) "
            "ORDER BY `__dblog_rn`")
        return self._plan_from_rows(table, after, self._query(sql, p.args + [int(size), int(parts), int(parts)]))

    def bound_predicate(self, table: TableSchema, cols: list[str], op: str, key: tuple) -> str:
        """``key-columns op key`` for ``range_predicates``: a key column of type CHAR, ENUM,
        SET, TIME, ... is named by its raw alias, and the literals need the JDBC session of
        ``jdbc()`` (no NO_BACKSLASH_ESCAPES)."""
        return key_predicate(cols, op, self._key_sql(table, key), sql_literal)

    def _key_sql(self, table: TableSchema, key: tuple, exact: bool = True) -> tuple:
        native = self.native_columns(table.qualified)
        return tuple(key_sql_value(native[k], v, exact) for k, v in zip(table.key, key))

    def key_order(self, table: TableSchema, key: tuple) -> list[tuple[bool, Any]]:
        """As SqlSource's, with ENUM and SET keys ordered by their numbers (the server's order)."""
        native = self.native_columns(table.qualified)
        out = super().key_order(table, key)
        for i, k in enumerate(table.key):
            if native[k].data_type in ("enum", "set"):
                try:
                    out[i] = (True, key_sql_value(native[k], key[i]))
                except ValueError:
                    out[i] = (False, key[i])
        return out

    def select_list(self, table: TableSchema) -> str:
        native = self.native_columns(table.qualified)
        return ", ".join(select_expr(native[c]) for c in table.column_names)

    def select_keys(self, table: TableSchema, keys: Sequence[tuple]) -> pa.Table:
        """The current rows of the given keys (bound parameters, autocommit statements)."""
        cols: dict[str, list] = {c: [] for c in table.column_names}
        base = f"SELECT {self.select_list(table)} FROM {quote_table(table.qualified)} WHERE "
        keys = list(dict.fromkeys(tuple(k) for k in keys))
        for i in range(0, len(keys), SELECT_BATCH):
            batch = keys[i:i + SELECT_BATCH]
            sql_keys = [self._key_sql(table, k, exact=False) for k in batch]
            if len(table.key) == 1:
                where = f"{quote_ident(table.key[0])} IN ({', '.join(['%s'] * len(batch))})"
                args = [k[0] for k in sql_keys]
            else:
                one = "(" + " AND ".join(f"{quote_ident(k)} = %s" for k in table.key) + ")"
                where = " OR ".join([one] * len(batch))
                args = [v for k in sql_keys for v in k]
            self._append_rows(table, cols, self._query(base + where, args))
        return self._arrow(table, cols)

    def keys_where(self, table: TableSchema, condition: str, limit: int) -> list[tuple]:
        """Keys of the rows matching a user's WHERE condition (parsed strictly, values bound),
        in key order; at most ``limit`` + 1 so the caller can tell it was cut."""
        cond = parse_condition(table, condition, quote_ident)
        native = self.native_columns(table.qualified)
        exprs = ", ".join(select_expr(native[k]) for k in table.key)
        order = ", ".join(f"{quote_table(table.qualified)}.{quote_ident(k)}" for k in table.key)
        sql = (f"SELECT {exprs} FROM {quote_table(table.qualified)} WHERE {cond.sql} "
               f"ORDER BY {order} LIMIT {int(limit) + 1}")
        return [self._typed_key(table, row) for row in self._query(sql, list(cond.params))]

    # -- Spark JDBC ----------------------------------------------------------------
    def jdbc(self) -> tuple[str, dict[str, str]]:
        """URL and properties for spark.read.jdbc (jdbc.jdbc_connection)."""
        return jdbc_connection(self.config.endpoint)

    def jdbc_table(self, table: str | TableSchema) -> str:
        """spark.read.jdbc's ``table`` (jdbc.jdbc_table): select ``table.column_names``
        from it (key columns read through an expression add raw aliases)."""
        schema = table if isinstance(table, TableSchema) else self.table_schema(table)
        return jdbc_table(schema, self.native_columns(schema.qualified))

    # -- the binlog ----------------------------------------------------------------
    def current_resume(self) -> tuple[Position, dict]:
        rows = None
        for stmt in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
            try:
                rows = self._query(stmt)
                break
            except pymysql.err.ProgrammingError:
                continue
        if not rows:
            raise SourceSetupError(f"source {self.name!r}: the binary log is disabled "
                                   "(SHOW MASTER STATUS is empty); start the server with --log-bin")
        file, pos = str(rows[0][0]), int(rows[0][1])
        return Position(binlog_file_number(file), pos, 0), {"file": file, "pos": pos}

    def _decode_tables(self, natives) -> None:
        """The server's decode tables of these columns' single-byte charsets (once per process)."""
        load_decode_tables(self._query, {n.charset for n in natives})

    # can't connect, server gone away, lost connection, shutdown in progress, connection killed
    TRANSIENT_CODES = frozenset({2003, 2006, 2013, 2055, 1053, 1927})

    def is_transient(self, error: BaseException) -> bool:
        if isinstance(error, pymysql.err.InterfaceError):  # the connection is closed
            return True
        if isinstance(error, pymysql.err.OperationalError):
            return bool(error.args) and error.args[0] in self.TRANSIENT_CODES
        return super().is_transient(error)

    def log_gap(self, resume: dict) -> str | None:
        """The binlog file the checkpoint resumes in was purged (PURGE BINARY LOGS,
        binlog_expire_logs_seconds / expire_logs_days, a restored server)."""
        files = [str(r[0]) for r in self._query("SHOW BINARY LOGS")]
        if resume["file"] in files:
            return None
        return (f"binlog file {resume['file']} (the checkpoint resumes at position {resume['pos']} in it) is no "
                f"longer on the server; its oldest binlog is {files[0] if files else 'none'}: purged before the "
                "tail read it (raise binlog_expire_logs_seconds above the longest tail outage)")

    def read_log(self, resume: dict | None, should_stop: Callable[[], bool],
                 server_id: int | None = None) -> Iterator[LogItem]:
        """Row changes of the configured tables, watermark writes, transaction ends and
        Idle (binlog heartbeats every ``heartbeat_seconds`` while caught up), from ``resume``
        (a TxnEnd's resume dict; None: the current end of the log).

        ``server_id`` defaults to the config's; concurrent readers need different ones."""
        if resume is None:
            _, resume = self.current_resume()
        tables = {t: self._captured(t) for t in self.tables}
        self._decode_tables([n for c in tables.values() for n in c.native.values()])
        settings = StreamSettings(
            self.name, self.config.endpoint,
            int(server_id if server_id is not None else self.config.server_id),
            self.config.heartbeat_seconds, self.read_timeout_s)
        def refresh(table: str) -> CapturedTable:
            self.refresh_schema(table)
            self._decode_tables(self.native_columns(table).values())
            return self._captured(table)
        reader = (MesBinlogReader if self.config.decoder == "mysql-event-stream" else BinlogReader)(
            settings, tables, self.watermark_table, resume, refresh)
        reader.replay = self._replay
        yield from reader.read(should_stop)

    def _captured(self, table: str) -> CapturedTable:
        return CapturedTable(self.table_schema(table), self.native_columns(table), self.transactional(table),
                             dict(self._defaults.get(table, {})), self._creates.get(table, ""))

    def _replay(self, st, old: CapturedTable) -> CapturedTable | None:
        """The shape ``old`` has after the ALTER ``st`` (a TableStatement), computed by the
        server on a scratch copy (shape_replay.py): the catalog is past it. Taken as the
        table's shape here (its version records it), or None."""
        zero_as_null = self.config.zero_dates == "null"
        try:
            found = replay_alter(self._connect, self.namespace, st.table, old.create, st.query, st.db,
                                 lambda query, scratch: read_table(query, scratch, self.name, zero_as_null),
                                 st.sql_mode)
        except DBLogError as e:   # a shape no target can take (the catalog may be past it too): quarantined
            log.warning("%s: the shape after %r cannot be carried (%s)", st.table, st.query[:200], e)
            return None
        if found is None or defined_elsewise(st.altered.defined if st.altered else (), found, self._captured(st.table)):
            return None
        db, _, name = st.table.partition(".")
        with self._lock:
            self._schemas[st.table] = dataclasses.replace(found.schema, database=db, name=name)
            self._native[st.table], self._engines[st.table] = found.native, found.engine
            self._defaults[st.table], self._creates[st.table] = found.defaults, scratch_name_in(found.create, st.table)
        self._decode_tables(found.native.values())
        log.info("%s: the catalog is past the ALTER TABLE here; its shape after it was computed on a scratch "
                 "copy", st.table)
        return self._captured(st.table)
