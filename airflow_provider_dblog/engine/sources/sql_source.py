"""What the SQL sources (MySQL/MariaDB, PostgreSQL) share, whatever their dialect:
the schema cache, connection lifetime, and turning fetched rows into typed keys,
chunk plans and Arrow tables, and the frame of ``check`` (set-up, watermark table, each
table, the log). A subclass supplies ``_load_schema``, the checks of its own server
(``server_settings``, ``setup_problems``, ...), ``bound_predicate`` (one side of a key
range in its dialect), ``to_logical`` (native value -> logical type) and ``needs_expr``
(read through an expression, so key predicates use the raw alias)."""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Collection, Sequence

import pyarrow as pa

from ..config import SourceConfig, check_identifier
from ..errors import (NoPrimaryKeyError, SchemaChangedError, SourceSetupError, UncarriedValueError, UnknownTableError,
                      ZeroDateError)
from ..schema import TableSchema
from ..arrow_values import column_from_text, from_arrow, to_arrow
from .base import ChunkPlan, Problem

log = logging.getLogger(__name__)

WATERMARK_TABLE = "watermark"
SELECT_BATCH = 500  # keys per select_keys statement


# what fixes a table the schema reader refuses
TABLE_FIXES = {UnknownTableError: "create the table or remove it from the config",
               NoPrimaryKeyError: "add a PRIMARY KEY to the table (DBLog chunks and reconciles by primary key)",
               SourceSetupError: "change the column type or stop capturing the table"}


def quote_with(mark: str, name: str) -> str:
    """An identifier between ``mark`` quotes (embedded marks doubled), refusing what no
    database names a thing (empty, NUL)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"bad identifier {name!r}")
    return mark + name.replace(mark, mark + mark) + mark


def driver_text(e: Exception) -> str:
    return str(e).strip()


def raw_key_alias(name: str) -> str:
    """The name under which ``jdbc_table`` exposes a key column's raw value."""
    return f"__dblog_key_{name}"


class SqlSource:
    to_logical: Callable[[Any, Any], Any]   # set by the subclass (staticmethod)
    needs_expr: Callable[[Any], bool]
    text_parsed: Callable[[Any], bool]      # selected as text that values.py parses
    dialect: str                            # of that text: "mysql" | "postgres"

    def __init__(self, config: SourceConfig):
        self.config = config
        self.name = config.name
        self.tables = tuple(config.tables)
        self.namespace = check_identifier(config.watermark_namespace, "watermark namespace")
        self.watermark_table = f"{self.namespace}.{WATERMARK_TABLE}"
        self._schemas: dict[str, TableSchema] = {}
        self._native: dict[str, dict[str, Any]] = {}
        self._conn = None
        self._wm_conn = None
        self._lock = threading.RLock()
        self._wm_lock = threading.Lock()

    # -- lifetime --------------------------------------------------------------
    def close(self) -> None:
        for attr in ("_conn", "_wm_conn"):
            conn = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # already gone
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks: the frame; the server's own checks are the subclass's ------------
    driver_error: type[Exception] = Exception   # the DB-API driver's base error class
    definition_grant = "grant SELECT on the table"   # what lets the user read a table's definition

    def check(self, scan_values: bool = False) -> list[Problem]:
        """Everything that keeps this source from CDC, each with its fix; [] means ready.
        ``scan_values``: also scan each table once for values no target can hold
        (``value_problems``; ``dblog check`` does, a tail's start does not)."""
        try:
            settings = self.server_settings()
        except self.driver_error as e:
            return [self.unreachable(e)]
        problems = self.setup_problems(settings)
        problems += self.watermark_problems()
        for table in self.tables:
            problems += self.table_problems(table, scan_values)
        return problems + self.log_problems()

    def unreachable(self, error: Exception) -> Problem:
        ep = self.config.endpoint
        return Problem(f"cannot connect to {ep.host}:{ep.port} as {ep.user}: {driver_text(error)}",
                       "check the host, port, user and password of the source")

    def watermark_problems(self) -> list[Problem]:
        try:
            self.ensure_watermark_table()
            self.probe_watermark_write()
        except self.driver_error as e:
            return [Problem(f"cannot create or write the watermark table {self.watermark_table}: "
                            f"{driver_text(e)}", self.watermark_grant())]
        return []

    def table_problems(self, table: str, scan_values: bool) -> list[Problem]:
        try:
            self.refresh_schema(table)
        except (UnknownTableError, NoPrimaryKeyError, SourceSetupError) as e:
            return [Problem(str(e), TABLE_FIXES[type(e)], table)]
        except self.driver_error as e:
            return [Problem(f"cannot read the table's definition: {driver_text(e)}", self.definition_grant, table)]
        problems = self.capture_problems(table)
        try:
            self.probe_select(table)
        except self.driver_error as e:
            return problems + [Problem(f"cannot select from the table: {driver_text(e)}",
                                       f"GRANT SELECT ON {self.quote_table(table)} TO <user>", table)]
        return problems + (self.value_problems(table) if scan_values else [])

    def capture_problems(self, table: str) -> list[Problem]:
        """What else keeps the log from carrying this table's changes (none by default)."""
        return []

    def log_problems(self) -> list[Problem]:
        """What keeps the log itself from being read (none by default)."""
        return []

    # -- the log (a source that needs set-up or acknowledgements overrides these) --
    def prepare_log(self) -> None:
        """Make the log readable from the current position on (e.g. create a slot)."""

    def confirm(self, resume: dict) -> None:
        """Everything before ``resume`` is durable (a slot may release its log)."""

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` is the server being away (down, restarting, the connection cut),
        which a retry after a pause may get past, rather than a fault of the request."""
        return isinstance(error, (ConnectionError, TimeoutError))

    def log_gap(self, resume: dict) -> str | None:
        """Why the log can no longer be read from ``resume`` (a checkpoint's), or None."""
        return None

    def check_or_raise(self, captured: Collection[str] = ()) -> None:
        """SourceSetupError naming every problem of the source; a problem of a table in
        ``captured`` (one the tail already reads: it has a schema version) is only logged,
        since one table's trouble stops only that table (the reader quarantines it where
        the log shows it)."""
        problems = self.check()
        for p in problems:
            if p.table and p.table in captured:
                log.warning("source %s: %s (the table is captured already: only it stops)", self.name, p)
        problems = [p for p in problems if not (p.table and p.table in captured)]
        if problems:
            raise SourceSetupError(f"source {self.name!r} is not ready for CDC:\n"
                                   + "\n".join(f"- {p}" for p in problems))

    # -- schemas ---------------------------------------------------------------
    def _load_schema(self, table: str) -> None:
        raise NotImplementedError

    def table_schema(self, table: str) -> TableSchema:
        self.config.table(table)
        with self._lock:
            if table not in self._schemas:
                self._load_schema(table)
            return self._schemas[table]

    def refresh_schema(self, table: str) -> TableSchema:
        self.config.table(table)
        with self._lock:
            self._schemas.pop(table, None)
            self._native.pop(table, None)
            self._load_schema(table)
            return self._schemas[table]

    def native_columns(self, table: str) -> dict[str, Any]:
        self.table_schema(table)
        return self._native[table]

    # -- schema versions (engine/schema_history.py) ----------------------------
    native_type: type   # the source's NativeColumn dataclass (set by the subclass)

    def mark_shapes(self) -> None:
        """Where the log says every change of shape at its place (a binlog's DDL), nothing to
        mark; PostgreSQL marks them (postgres/watermarks.py)."""

    def describe_table(self, table: str) -> dict:
        """The table's shape as last read, JSON-able: what the log reader needs to decode
        its rows (a schema version, stored by the tail at the position it holds from)."""
        schema = self.table_schema(table)
        return {"schema": schema.to_dict(),
                "native": [dataclasses.asdict(n) for n in self.native_columns(table).values()],
                "extra": self._table_extra(table)}

    def adopt_table(self, table: str, desc: dict) -> TableSchema:
        """Take ``desc`` (a stored :meth:`describe_table`) as the table's shape instead of
        the catalog's: the log is read from a position where it held."""
        self.config.table(table)
        native = {d["name"]: self.native_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
                  for d in desc["native"]}
        with self._lock:
            self._schemas[table] = TableSchema.from_dict(desc["schema"])
            self._native[table] = native
            self._adopt_extra(table, desc.get("extra") or {})
            return self._schemas[table]

    def added_column_fill(self, table: str, column: str) -> tuple[bool, Any]:
        """What rows that existed when ``column`` was added hold in it (engine/schema_evolution.py):
        (True, value), or (False, why) when the source cannot say."""
        return False, "the source cannot say what existing rows hold"

    def _table_extra(self, table: str) -> dict:
        return {}

    def _adopt_extra(self, table: str, extra: dict) -> None:
        pass

    value_errors: tuple[type[Exception], ...] = ()   # the driver's "not a value of this type"

    def present_keys(self, table: TableSchema, keys: list[tuple]) -> list[tuple]:
        """The given keys that the source has a row for (bound selects). A key the column's
        type cannot even hold (an enum label PostgreSQL does not know) is not there: the
        batch holding it is split until it is alone."""
        if not keys:
            return []
        try:
            rows = self.select_keys(table, keys)
        except self.value_errors:
            if len(keys) == 1:
                return []
            half = len(keys) // 2
            return self.present_keys(table, keys[:half]) + self.present_keys(table, keys[half:])
        cols = [from_arrow(t, rows[k]) for k, t in zip(table.key, table.key_types)]
        return list(zip(*cols))

    # logical types whose Python order is the server's (text is not: collations, enum labels)
    ORDERED_TYPES = ("int", "decimal(", "numeric", "float", "date", "timestamp", "binary")

    def key_order(self, table: TableSchema, key: tuple) -> list[tuple[bool, Any]]:
        """``key`` as (orderable, value) per column: orderable values compare in Python as the
        server orders the column (engine/chunks.py ``advances``); the others only for equality."""
        import decimal
        out = []
        for t, v in zip(table.key_types, key):
            ordered = v is not None and t.startswith(self.ORDERED_TYPES)
            if ordered and t.startswith("numeric") and isinstance(v, str):
                v = decimal.Decimal(v)
            out.append((ordered, v))
        return out

    def canonical_keys(self, table: TableSchema, keys: list[tuple]) -> list[tuple]:
        """Keys from a user in the form the source prints them (see PostgresSource)."""
        return keys

    def equal_keys(self, table: TableSchema, candidates: list[tuple], known: list[str]) -> set[int]:
        """The indexes of ``candidates`` the source's ``=`` takes for one of ``known`` though
        their texts differ (postgres/key_texts.py); none here."""
        return set()

    # -- rows ------------------------------------------------------------------
    def _typed_key(self, table: TableSchema, values: Sequence[Any]) -> tuple:
        native = self.native_columns(table.qualified)
        return tuple(self.to_logical(native[k], v) for k, v in zip(table.key, values))

    def _plan_from_rows(self, table: TableSchema, after: tuple | None, rows: list[tuple]) -> ChunkPlan | None:
        """A plan query's rows: the partition bounds' keys, then the chunk's key count."""
        if not rows:
            return None
        n = len(table.key)
        bounds = [self._typed_key(table, r[:n]) for r in rows]
        return ChunkPlan(after=after, end=bounds[-1], bounds=(after, *bounds), rows=int(rows[0][n]))

    def range_predicates(self, table: TableSchema, plan: ChunkPlan) -> list[str]:
        """One WHERE predicate per partition, ``bounds[i] < key <= bounds[i+1]``, with
        literals rendered from the plan's bounds (Spark cannot bind parameters), written
        against ``jdbc_table(table)`` (a key column read through an expression is named by
        its raw alias there) for the JDBC session of ``jdbc()``."""
        cols = self._predicate_columns(table)
        out = []
        for lo, hi in zip(plan.bounds, plan.bounds[1:]):
            if hi is None:
                raise ValueError("a partition's upper bound cannot be None")
            parts = [] if lo is None else [self.bound_predicate(table, cols, ">", lo)]
            parts.append(self.bound_predicate(table, cols, "<=", hi))
            out.append(" AND ".join(parts))
        return out

    def _predicate_columns(self, table: TableSchema) -> list[str]:
        native = self.native_columns(table.qualified)
        return [raw_key_alias(k) if self.needs_expr(native[k]) else k for k in table.key]

    def _append_rows(self, table: TableSchema, cols: dict[str, list], rows: list[tuple]) -> None:
        """Rows as select_list reads them: columns read as text stay text (conform_chunk
        parses them, as for a Spark chunk), the others become logical values."""
        native = self.native_columns(table.qualified)
        for row in rows:
            for c, v in zip(table.column_names, row):
                n = native[c]
                if self.text_parsed(n):
                    cols[c].append(v)
                    continue
                try:
                    cols[c].append(self.to_logical(n, v))
                except (TypeError, ValueError) as e:
                    raise SchemaChangedError(
                        f"{table.qualified}.{c}: {e}; the table changed, refresh its schema "
                        "and re-dump it") from None

    def _arrow(self, table: TableSchema, cols: dict[str, list]) -> pa.Table:
        native = self.native_columns(table.qualified)
        arrays = [pa.array(cols[c.name], pa.string()) if self.text_parsed(native[c.name])
                  else to_arrow(c.type, cols[c.name]) for c in table.columns]
        return self.conform_chunk(table, pa.table(arrays, names=table.column_names))

    def conform_chunk(self, table: TableSchema, data: pa.Table) -> pa.Table:
        """Chunk rows as selected (select_list, jdbc_table: some columns as text) in the
        table's logical types, plus ERROR_COLUMN (reconcile.py) naming each value that no
        target could hold (that value is null). One parser for the text of every path:
        Spark chunks and key lists alike (engine/values.py)."""
        from ..reconcile import ERROR_COLUMN

        native = self.native_columns(table.qualified)
        errors: dict[int, list[str]] = {}
        if ERROR_COLUMN in data.column_names:   # conformed once already: keep what it said
            for i, e in enumerate(data[ERROR_COLUMN].to_pylist()):
                if e is not None:
                    errors[i] = [e]
        arrays = []
        for c in table.columns:
            arr = data[c.name]
            if self.text_parsed(native[c.name]) and pa.types.is_string(arr.type):
                arr, bad = column_from_text(c.type, self.dialect, arr)
                for i, e in bad.items():
                    if isinstance(e, ZeroDateError) and getattr(native[c.name], "zero_as_null", False):
                        continue
                    if c.name in table.key:   # no row of a target can have this key
                        raise UncarriedValueError(
                            f"{table.qualified}.{c.name}, a key column, holds a value no target can "
                            f"hold: {e}. Fix the row at the source, then dump the table again") from None
                    errors.setdefault(i, []).append(f"{table.qualified}.{c.name}: {e}")
            arrays.append(arr.cast(c.arrow_type))
        out = pa.table(arrays, schema=pa.schema(list(table.row_struct())))
        err = (pa.array([("; ".join(errors[i]) if i in errors else None) for i in range(out.num_rows)],
                        pa.string()) if errors else pa.nulls(out.num_rows, pa.string()))
        return out.append_column(ERROR_COLUMN, err)
