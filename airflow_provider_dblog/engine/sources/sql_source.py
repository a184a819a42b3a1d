"""What the SQL sources (MySQL/MariaDB, PostgreSQL) share, whatever their dialect:
the schema cache, connection lifetime, and turning fetched rows into typed keys,
chunk plans and Arrow tables. A subclass supplies ``_load_schema``, ``check``,
``to_logical`` (native value -> logical type) and ``needs_expr`` (read through an
expression, so key predicates use the raw alias)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import pyarrow as pa

from ..config import SourceConfig, check_identifier
from ..errors import SchemaChangedError, SourceSetupError, UncarriedValueError, ZeroDateError
from ..schema import TableSchema
from ..arrow_values import column_from_text, from_arrow, to_arrow
from .base import ChunkPlan

WATERMARK_TABLE = "watermark"
SELECT_BATCH = 500  # keys per select_keys statement


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

    def check(self, scan_values: bool = False) -> list:
        raise NotImplementedError

    # -- the log (a source that needs set-up or acknowledgements overrides these) --
    def prepare_log(self) -> None:
        """Make the log readable from the current position on (e.g. create a slot)."""

    def confirm(self, resume: dict) -> None:
        """Everything before ``resume`` is durable (a slot may release its log)."""

    def check_or_raise(self) -> None:
        problems = self.check()
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

    def canonical_keys(self, table: TableSchema, keys: list[tuple]) -> list[tuple]:
        """Keys from a user in the form the source prints them (see PostgresSource)."""
        return keys

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
