"""PostgreSQL source: pg_catalog shapes, watermarks, key-range chunk planning and
bound-parameter key lookups. The log reader (logical replication with pgoutput)
is not here yet: ``read_log`` raises NotImplementedError.

Positions are (0, commit LSN, change index within the transaction).

Every statement runs in autocommit with its values bound (``%s``) and its
identifiers quoted by ``psycopg2.sql.Identifier``. The SQL text that leaves this
module without a connection (Spark's ``predicates=`` and ``table``, the quoter of
user WHERE conditions) is quoted by ``quote_ident``, which writes what
``Identifier`` writes, and renders literals by type (``pg_literal``).

Types (native -> logical, engine/schema.py):

* int2/int4/int8 -> int16/int32/int64; float4/float8 -> float32/float64; bool -> bool
* numeric(p,s) / numeric -> numeric(p,s) / numeric: the exact text (NaN and
  ±Infinity included), typed numeric in a target
* text/varchar/bpchar/name/citext, enums -> string (CHAR(n) keeps its padding)
* uuid, inet, cidr, macaddr(8), xml, interval, time, timetz, bit, varbit, jsonb and
  arrays of built-in types -> ``text:<the column's type>``: PostgreSQL's own text of the
  value, which a target column of the same type reads back unchanged
* json -> json (the text as written); bytea -> binary
* date / timestamp / timestamptz -> date / timestamp / timestamptz, BC years and
  ±infinity included (engine/values.py FarDate / FarTimestamp)
* money and other types -> refused by ``dblog check`` (money's text depends on lc_monetary)

Every value that is not a plain int, float, bool, bytea or text is selected as its text
(``select_expr``: ``::text``) and parsed by the same functions on every path: the log
(pgoutput sends text), ``select_keys`` and the Spark chunk select. Every session prints
with ``values.PG_TEXT_SETTINGS``, whatever the server's defaults.

Nothing here imports Airflow.
"""
from __future__ import annotations

import datetime as dt
import decimal
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

import pyarrow as pa

from ..config import SourceConfig
from ..errors import (InvalidKeyError, NoPrimaryKeyError, SourceSetupError,
                      UnknownTableError, WatermarkError)
from ..positions import Position
from ..schema import Column, TableSchema, is_text_carried
from ..values import (FarDate, FarTimestamp, float32, parse_pg_date, parse_pg_timestamp, pg_date_text,
                      pg_options, pg_set_statements, pg_timestamp_text)
from .base import ChunkPlan, LogItem, Problem
from .common import SELECT_BATCH, WATERMARK_TABLE, SqlSource, raw_key_alias

log = logging.getLogger(__name__)

JDBC_DRIVER = "org.postgresql.Driver"
# standard_conforming_strings: range_predicates' literals never use backslash escapes
# (a bytea literal is '\x..'), so they must be read as written
JDBC_SESSION_INIT = ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; "
                     + pg_set_statements())
UTC = dt.timezone.utc


# -- LSNs -------------------------------------------------------------------------
_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def lsn_to_int(lsn: str) -> int:
    """``"16/B374D848"`` -> 0x16B374D848."""
    m = _LSN.match(str(lsn).strip())
    if not m:
        raise ValueError(f"not an LSN: {lsn!r}")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def int_to_lsn(value: int) -> str:
    """0x16B374D848 -> ``"16/B374D848"`` (PostgreSQL's form: upper-case hex, no padding)."""
    value = int(value)
    if not 0 <= value < (1 << 64):
        raise ValueError(f"LSN out of range: {value}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


# -- identifiers and literals ---------------------------------------------------
def quote_ident(name: str) -> str:
    """A PostgreSQL identifier in double quotes (embedded quotes doubled): the text
    ``psycopg2.sql.Identifier(name)`` renders, for SQL that is built without a connection."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"bad identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_table(qualified: str) -> str:
    schema, _, table = qualified.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(table)}"


def _ident_table(qualified: str) -> sql.Composable:
    schema, _, table = qualified.partition(".")
    return sql.Identifier(schema, table)


def _stmt(before: str, table: str, after: str = "") -> sql.Composed:
    """``before <table> after``: the table quoted by sql.Identifier; the texts may hold
    quoted column names (never passed through str.format-like templating)."""
    return sql.Composed([sql.SQL(before), _ident_table(table), sql.SQL(after)])


def _quote_string(text: str) -> str:
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot contain NUL characters")
    return "'" + text.replace("'", "''") + "'"


def pg_literal(value: Any, native_type: str = "") -> str:
    """A key value (read from the database itself) as a PostgreSQL literal.

    Only for values that came from the source (chunk bounds), never for user input.
    Assumes standard_conforming_strings=on (jdbc() sets it). ``native_type`` is the
    column's base type name (pg_type.typname): it picks timestamptz/float4 literals.
    Strings are untyped literals, which PostgreSQL reads as the column's own type
    (uuid, time, numeric, enum, ... keys are strings in the engine)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return "'NaN'::numeric"
        if not value.is_finite():
            raise ValueError(f"cannot render an infinite decimal {value!r}")
        return format(value, "f")
    if isinstance(value, float):
        cast = "float4" if native_type == "float4" else "float8"
        if math.isnan(value):
            return f"'NaN'::{cast}"
        if math.isinf(value):
            return f"'{'-' if value < 0 else ''}Infinity'::{cast}"
        return f"'{value!r}'::{cast}"
    if isinstance(value, str):
        return _quote_string(value)
    if isinstance(value, (dt.datetime, FarTimestamp)):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            raise ValueError(f"cannot render timezone-aware datetime {value!r}")
        if native_type == "timestamptz":  # the engine's value is the UTC wall clock
            return f"'{pg_timestamp_text(value, True)}'::timestamptz"
        return f"'{pg_timestamp_text(value, False)}'::timestamp"
    if isinstance(value, (dt.date, FarDate)):
        return f"'{pg_date_text(value)}'::date"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "'\\x" + bytes(value).hex() + "'::bytea"
    raise TypeError(f"cannot render a {type(value).__name__} key value as SQL: {value!r}")


def _qx(name: str) -> str:
    """quote_ident for statements executed with parameters (a % in a name doubled)."""
    return quote_ident(name).replace("%", "%%")


def _row(cols: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    q = [quote(c) for c in cols]
    return q[0] if len(q) == 1 else "(" + ", ".join(q) + ")"


def key_after(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any, str], str],
              types: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    """``(a, b) > (x, y)``: PostgreSQL's row comparison, an index range scan on (a, b)."""
    rhs = [lit(v, t) for v, t in zip(vals, types)]
    return f"{_row(cols, quote)} > {rhs[0] if len(rhs) == 1 else '(' + ', '.join(rhs) + ')'}"


def key_upto(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any, str], str],
             types: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    rhs = [lit(v, t) for v, t in zip(vals, types)]
    return f"{_row(cols, quote)} <= {rhs[0] if len(rhs) == 1 else '(' + ', '.join(rhs) + ')'}"


class _Params:
    """A literal renderer that binds: each value becomes %s and joins ``args``
    (a timestamptz key value, naive UTC in the engine, is bound as aware UTC)."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def __call__(self, value: Any, native_type: str = "") -> str:
        if isinstance(value, (dt.datetime, FarTimestamp)):   # the text PostgreSQL reads exactly
            value = pg_timestamp_text(value, native_type == "timestamptz")
        elif isinstance(value, FarDate):
            value = pg_date_text(value)
        self.args.append(value)
        return "%s"


# -- native types -> logical types ---------------------------------------------
_SIMPLE = {"int2": "int16", "int4": "int32", "int8": "int64", "float4": "float32",
           "float8": "float64", "bool": "bool", "json": "json", "bytea": "binary", "date": "date",
           "timestamp": "timestamp", "timestamptz": "timestamptz"}
_STRINGS = {"text", "varchar", "bpchar", "name", "citext"}
# carried as PostgreSQL's text, typed as the column's own type in a target
_TEXT_TYPED = {"uuid", "inet", "cidr", "macaddr", "macaddr8", "xml", "interval", "time", "timetz",
               "bit", "varbit", "jsonb"}
_PARSED = {"date", "timestamp", "timestamptz"}   # selected as text, parsed by values.py
_INT_BITS = {"int16": 16, "int32": 32, "int64": 64}


@dataclass(frozen=True)
class NativeColumn:
    name: str
    type_name: str       # base type's pg_type.typname ("_int4" for int4[])
    formatted: str       # format_type() of the base type: "numeric(10,2)", "integer[]", ...
    logical: str
    category: str = ""   # pg_type.typcategory of the base type ("A" array, "E" enum)
    type_oid: int = 0    # the base type's oid (how pgoutput's text value is parsed)
    att_type_oid: int = 0  # the column's declared type oid (a domain's own), as pgoutput sends it


def logical_type(type_name: str, category: str, formatted: str, builtin: bool = True) -> str:
    """The logical type of a PostgreSQL column (base type of a domain); ValueError if
    unsupported. ``formatted``: format_type of the base type with the column's typmod;
    ``builtin``: the type (an array's element type) is one of PostgreSQL's own."""
    from ..schema import arrow_type

    t = type_name.lower()
    if category == "A":
        if builtin:
            try:
                arrow_type(f"text:{formatted}")
                return f"text:{formatted}"
            except ValueError:
                pass
        return "string"   # an array of an enum, a domain, a composite: its text
    if category == "E":
        return "string"
    if t in _SIMPLE:
        return _SIMPLE[t]
    if t == "numeric":
        m = re.fullmatch(r"numeric\((\d+),(\d+)\)", formatted)
        return f"numeric({m.group(1)},{m.group(2)})" if m else "numeric"
    if t in _STRINGS:
        return "string"
    if t in _TEXT_TYPED:
        return f"text:{formatted}"
    if t == "money":
        raise ValueError("type money is not supported: its text depends on lc_monetary, so no "
                         "value is exact across servers; use numeric(p,2)")
    raise ValueError(f"column type {type_name!r} is not supported")


def text_parsed(n: NativeColumn) -> bool:
    """Selected as text that engine/values.py parses into the logical type."""
    return n.type_name in _PARSED or n.logical.startswith("numeric")


def select_expr(n: NativeColumn, quote: Callable[[str], str] = quote_ident) -> str:
    """The SELECT expression giving a column's value in the form every path shares (the
    same for psycopg2 and Spark's JDBC reader): its text, unless it is a plain int,
    float, bool, bytea or text value."""
    q = quote(n.name)
    if text_parsed(n) or n.logical.startswith("text:") or n.logical == "json" or (
            n.logical == "string" and n.type_name not in ("text", "varchar", "bpchar", "name")):
        return f"{q}::text AS {q}"
    return q


def _needs_expr(n: NativeColumn) -> bool:
    return select_expr(n) != quote_ident(n.name)


def to_logical(n: NativeColumn, value: Any) -> Any:
    """A value from psycopg2 (through select_expr) as the column's logical Python type.
    Strict: an unexpected Python type raises TypeError (the table changed under us)."""
    if value is None:
        return None
    t = n.logical
    if isinstance(value, str) and text_parsed(n):
        return text_converter(n)(value)
    if t in _INT_BITS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return int(value)
    if t in ("float32", "float64"):
        if not isinstance(value, float):
            raise TypeError(f"expected a float, got {type(value).__name__}")
        return float32(value) if t == "float32" else value
    if t == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"expected a bool, got {type(value).__name__}")
        return value
    if is_text_carried(t):
        if not isinstance(value, str):
            raise TypeError(f"expected text, got {type(value).__name__}")
        return value
    if t == "binary":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    raise TypeError(f"no conversion of a {type(value).__name__} to {t}")


def text_converter(n: NativeColumn) -> Callable[[str], Any]:
    """The function turning a value in PostgreSQL's text output (pgoutput's tuple data,
    or a ``::text`` select) into the column's logical Python value: the same value on
    every path. Built once per column, not per value: the tail calls it for every value."""
    from . import pgoutput as po

    t = n.logical
    if is_text_carried(t):
        return str        # the text is the value (numeric: PostgreSQL's text is canonical)
    if t == "date":
        return parse_pg_date
    if t == "timestamp":
        return parse_pg_timestamp
    if t == "timestamptz":
        return lambda text: parse_pg_timestamp(text, True)
    if t == "float32":
        return lambda text: float32(float(text))
    parse = po.converter_for(n.type_oid)
    # these parsers always return exactly the logical type (and the tail checks every
    # Relation's type OIDs against the captured schema): no per-value to_logical
    exact = {"int16": (po.INT2,), "int32": (po.INT4,), "int64": (po.INT8,), "bool": (po.BOOL,),
             "binary": (po.BYTEA,), "float64": (po.FLOAT8,)}
    if n.type_oid in exact.get(t, ()):
        return parse
    return lambda text: to_logical(n, parse(text))


def from_text(n: NativeColumn, text: str | None) -> Any:
    """One value of ``text_converter``; None stays None."""
    return None if text is None else text_converter(n)(text)


# -- set-up checks (pure, so they can be unit-tested) -------------------------
def server_problems(settings: dict[str, Any]) -> list[Problem]:
    """Problems with the server's settings (pg_settings names, lower case)."""
    s = {k.lower(): ("" if v is None else str(v)).strip().lower() for k, v in settings.items()}
    out = []
    if s.get("wal_level") != "logical":
        out.append(Problem(f"wal_level is {s.get('wal_level') or 'unknown'}, not logical",
                           "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
    for name in ("max_replication_slots", "max_wal_senders"):
        if name in s and s[name].isdigit() and int(s[name]) < 1:
            out.append(Problem(f"{name} is {s[name]}: no logical replication connection is possible",
                               f"ALTER SYSTEM SET {name} = 10; then restart PostgreSQL"))
    return out


def role_problems(rolreplication: bool, rolsuper: bool) -> list[Problem]:
    if rolreplication or rolsuper:
        return []
    return [Problem("the user lacks the REPLICATION attribute (needed for a replication slot "
                    "and to read the WAL)", "ALTER ROLE <user> REPLICATION")]


# -- the source -----------------------------------------------------------------
class PostgresSource(SqlSource):
    """A PostgreSQL source of the DBLog engine (see sources/base.py Source)."""

    to_logical = staticmethod(to_logical)
    needs_expr = staticmethod(_needs_expr)
    text_parsed = staticmethod(text_parsed)
    dialect = "postgres"
    value_errors = (psycopg2.DataError,)

    def __init__(self, config: SourceConfig):
        super().__init__(config)
        self._replident: dict[str, str] = {}
        self._log = None

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

    # -- checks ------------------------------------------------------------------
    def server_settings(self) -> dict[str, str]:
        rows = self._query("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                           (["wal_level", "max_replication_slots", "max_wal_senders",
                             "synchronous_standby_names"],))
        return {str(k).lower(): str(v) for k, v in rows}

    def check(self, scan_values: bool = False) -> list[Problem]:
        """Everything that keeps this source from CDC, each with its fix; [] means ready.
        ``scan_values``: also scan each table once for values no target can hold
        (``value_problems``; ``dblog check`` does, a tail's start does not)."""
        try:
            settings = self.server_settings()
        except psycopg2.Error as e:
            ep = self.config.endpoint
            return [Problem(f"cannot connect to {ep.host}:{ep.port}/{ep.database} as {ep.user}: "
                            f"{str(e).strip()}",
                            "check the host, port, user, password and database of the source")]
        problems = server_problems(settings)
        rows = self._query("SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user")
        problems += role_problems(*rows[0]) if rows else role_problems(False, False)
        if settings.get("synchronous_standby_names") and not (rows and rows[0][1]):
            (stats,), = self._query("SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')")
            if not stats:
                problems.append(Problem(
                    "synchronous standbys are configured, and the user cannot see other sessions' "
                    "waits: a commit in the log but not yet visible (waiting for a standby) would "
                    "not be awaited by the watermarks, and a chunk could miss it",
                    "GRANT pg_read_all_stats TO <user>"))
        try:
            self.ensure_watermark_table()
            self._query(_stmt("UPDATE ", self.watermark_table,
                              " SET value = value WHERE id = 1 AND false"), fetch=False)
        except psycopg2.Error as e:
            problems.append(Problem(
                f"cannot create or write the watermark table {self.watermark_table}: {str(e).strip()}",
                f"GRANT CREATE ON DATABASE <db> TO <user> (the engine creates schema {self.namespace}), "
                f"or create {self.watermark_table} and GRANT SELECT, INSERT, UPDATE on it"))
        for table in self.tables:
            try:
                self.refresh_schema(table)
            except (UnknownTableError, NoPrimaryKeyError, SourceSetupError) as e:
                fix = {UnknownTableError: "create the table or remove it from the config",
                       NoPrimaryKeyError: "add a PRIMARY KEY to the table (DBLog chunks and "
                                          "reconciles by primary key)",
                       SourceSetupError: "change the column type or stop capturing the table"}
                problems.append(Problem(str(e), fix[type(e)], table))
                continue
            except psycopg2.Error as e:
                problems.append(Problem(f"cannot read the table's definition: {str(e).strip()}",
                                        "grant USAGE on the schema and SELECT on the table", table))
                continue
            if self._replident.get(table) != "f":
                ident = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}.get(
                    self._replident.get(table, ""), "unknown")
                problems.append(Problem(
                    f"REPLICA IDENTITY is {ident}, not FULL: the WAL would lack the before image "
                    "of updates and deletes (needed for key changes and deletes)",
                    f"ALTER TABLE {quote_table(table)} REPLICA IDENTITY FULL", table))
            try:
                self._query(_stmt("SELECT 1 FROM ", table, " LIMIT 0"))
            except psycopg2.Error as e:
                problems.append(Problem(f"cannot select from the table: {str(e).strip()}",
                                        f"GRANT SELECT ON {quote_table(table)} TO <user>", table))
                continue
            if scan_values:
                problems += self.value_problems(table)
        try:
            problems += self.log.problems()
        except SourceSetupError as e:   # a bad slot or publication name
            problems.append(Problem(str(e), "fix the `slot:` / `publication:` of the source"))
        except psycopg2.Error as e:
            problems.append(Problem(f"cannot read the replication slots and publications: "
                                    f"{str(e).strip()}", "grant pg_read_all_stats to the user"))
        return problems

    def value_problems(self, table: str) -> list[Problem]:
        """Values of the table that no target can hold exactly (one scan of the table):
        timestamps past Arrow's 64-bit microsecond range (years after 294246; PostgreSQL's
        own range starts at 4713 BC, well inside it; ±infinity are carried). Each would
        hold the table's apply."""
        schema = self.table_schema(table)
        native = self.native_columns(table)
        cols = [c.name for c in schema.columns if native[c.name].type_name in ("timestamp", "timestamptz")]
        if not cols:
            return []
        sums = ", ".join(
            f"count(*) FILTER (WHERE isfinite({_qx(c)}) AND {_qx(c)} >= '294247-01-01')" for c in cols)
        try:
            (counts,) = self._query(_stmt(f"SELECT {sums} FROM ", table))
        except psycopg2.Error as e:
            return [Problem(f"cannot scan the table's values: {str(e).strip()}",
                            "grant SELECT on the table", table)]
        return [Problem(f"{int(n):,} row(s) of column {c} hold timestamps past year 294246: no "
                        "target holds them exactly (the table's apply would stop before them)",
                        "UPDATE them to infinity or a nearer date", table)
                for c, n in zip(cols, counts) if int(n)]

    def canonical_keys(self, table: TableSchema, keys: list[tuple]) -> list[tuple]:
        """Keys from a user in the text PostgreSQL itself prints for them (a uuid in any
        case, an inet with or without its /32), so a requested key matches its row."""
        cols = [i for i, c in enumerate(table.key_columns) if c.type.startswith("text:")]
        if not cols or not keys:
            return keys
        out = [list(k) for k in keys]
        for i in cols:
            sql_type = table.key_columns[i].type[5:]   # checked against schema._TEXT_TYPE
            try:
                rows = self._query(f"SELECT v::{sql_type}::text FROM unnest(%s::text[]) "
                                   "WITH ORDINALITY AS u(v, n) ORDER BY n", ([k[i] for k in keys],))
            except psycopg2.DataError as e:
                raise InvalidKeyError(f"{table.qualified}.{table.key[i]} ({sql_type}): "
                                      f"{str(e).strip().splitlines()[0]}") from None
            for k, (v,) in zip(out, rows):
                k[i] = v
        return [tuple(k) for k in out]

    # -- schemas -----------------------------------------------------------------
    def replica_identity(self, table: str) -> str:
        """pg_class.relreplident as last read: f(ull), d(efault), n(othing), i(ndex)."""
        self.table_schema(table)
        return self._replident[table]

    def _load_schema(self, table: str) -> None:
        nsp, _, name = table.partition(".")
        rel = self._query(
            "SELECT c.oid, c.relkind, c.relreplident FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (nsp, name))
        if not rel:
            raise UnknownTableError(f"table {table} does not exist in source {self.name!r}")
        oid, kind, replident = rel[0]
        if kind != "r":
            what = {"v": "view", "m": "materialized view", "p": "partitioned table",
                    "f": "foreign table", "S": "sequence", "i": "index"}.get(kind, f"relkind {kind}")
            raise UnknownTableError(f"{table} is a {what}, not an ordinary table: only ordinary "
                                    "tables are captured (capture a partitioned table's partitions)")
        # a domain is its base type with the domain's own typmod; "builtin": the type (an
        # array's element type) is PostgreSQL's own, so a target has it too
        cols = self._query(
            "SELECT a.attname, bt.typname, "
            "format_type(bt.oid, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END), "
            "a.attnotnull, bt.typcategory, bt.oid, a.atttypid, "
            "bt.typnamespace = 'pg_catalog'::regnamespace AND (bt.typelem = 0 OR "
            "(et.typnamespace = 'pg_catalog'::regnamespace AND et.typtype = 'b')) "
            "FROM pg_attribute a "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END "
            "LEFT JOIN pg_type et ON et.oid = bt.typelem "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (oid,))
        key = [r[0] for r in self._query(
            "SELECT a.attname FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord", (oid,))]
        columns, native = [], {}
        for cname, tname, formatted, notnull, category, base_oid, att_oid, builtin in cols:
            try:
                logical = logical_type(tname, category, formatted, bool(builtin))
            except ValueError as e:
                raise SourceSetupError(f"{table}.{cname}: {e} ({formatted})") from None
            native[cname] = NativeColumn(cname, tname, formatted, logical, category,
                                         int(base_oid), int(att_oid))
            columns.append(Column(cname, logical, not notnull))
        schema = TableSchema(nsp, name, tuple(columns), tuple(key))  # NoPrimaryKeyError if no key
        self._schemas[table] = schema
        self._native[table] = native
        self._replident[table] = replident

    # -- watermarks --------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        wm = _ident_table(self.watermark_table)
        self._query(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.namespace)),
                    fetch=False)
        self._query(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id smallint PRIMARY KEY, "
                            "value text NOT NULL, updated_at timestamptz)").format(wm), fetch=False)
        ident = self._query(
            "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (self.namespace, WATERMARK_TABLE))
        if ident and ident[0][0] != "f":  # (ALTER takes a short exclusive lock: only once)
            self._query(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(wm), fetch=False)
        self._query(sql.SQL("INSERT INTO {} (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING")
                    .format(wm), fetch=False)

    def write_watermark(self, value: str) -> None:
        """One single-row UPDATE, alone in its own autocommit transaction."""
        if not isinstance(value, str) or not value or len(value) > 36:
            raise ValueError(f"a watermark is a UUID string of at most 36 characters, not {value!r}")
        query = _stmt("UPDATE ", self.watermark_table, " SET value = %s, updated_at = now() WHERE id = 1")
        with self._wm_lock:
            self._wm_conn = self._alive(self._wm_conn)
            with self._wm_conn.cursor() as cur:
                cur.execute(query, (value,))
                n = cur.rowcount
                if n == 1:
                    self._await_logged_commits(cur)
        if n != 1:
            raise WatermarkError(f"watermark row of {self.watermark_table} is missing "
                                 "(run ensure_watermark_table)")

    visible_timeout_s = 120.0   # how long a logged commit may stay invisible (see below)

    def _await_logged_commits(self, cur) -> None:
        """Wait until every transaction whose commit is in the WAL is visible.

        PostgreSQL writes a transaction's commit record, marks it committed, and only then
        makes it visible to new snapshots; a synchronous standby's acknowledgement comes in
        between. A transaction in that gap is in the log before this watermark, yet a chunk
        select after the watermark would not see it: its old row would be emitted at the HW,
        over the newer log event (tests/integration/test_invariants.py). So after a
        watermark, no transaction of this database may be committed and still running: none
        waiting for a synchronous standby (pg_stat_activity's ``SyncRep`` wait; seeing other
        users' sessions needs pg_read_all_stats, which ``check`` asks for), none committed
        in the commit log while still in the snapshot's running set. Fails closed after
        ``visible_timeout_s``."""
        deadline = time.monotonic() + self.visible_timeout_s
        while True:
            cur.execute(
                "SELECT array_agg(DISTINCT x) FROM ("
                " SELECT backend_xid::text AS x FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                " AND datname = current_database() AND backend_xid IS NOT NULL UNION ALL "
                " SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
                " WHERE pg_xact_status(x) = 'committed') AS logged")
            (pending,), = cur.fetchall()
            if not pending:
                return
            if time.monotonic() > deadline:
                raise WatermarkError(
                    f"source {self.name!r}: transaction(s) {', '.join(pending[:5])} committed in the "
                    f"log but still not visible after {self.visible_timeout_s:.0f}s (a synchronous "
                    "standby that does not answer?): a chunk select would not see them. Fix the "
                    "standby (synchronous_standby_names), then resume the dump")
            time.sleep(0.005)

    # -- chunks ------------------------------------------------------------------
    def _key_types(self, table: TableSchema) -> list[str]:
        native = self.native_columns(table.qualified)
        return [native[k].type_name for k in table.key]

    def _key_exprs(self, table: TableSchema) -> str:
        native = self.native_columns(table.qualified)
        return ", ".join(select_expr(native[k], _qx) for k in table.key)

    def _order(self, table: TableSchema, desc: bool = False) -> str:
        """ORDER BY the key columns themselves: a bare name would sort by the output
        column of that name, which select_expr may have made text (9.5 > 10.5)."""
        qt = quote_table(table.qualified).replace("%", "%%")
        return ", ".join(f"{qt}.{_qx(k)}{' DESC' if desc else ''}" for k in table.key)

    def max_key(self, table: TableSchema) -> tuple | None:
        desc = self._order(table, desc=True)
        rows = self._query(_stmt(f"SELECT {self._key_exprs(table)} FROM ", table.qualified,
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
        p = _Params()
        cond = []
        if after is not None:
            cond.append(key_after(table.key, after, p, types, _qx))
        cond.append(key_upto(table.key, upto, p, types, _qx))
        keys = ", ".join(_qx(k) for k in table.key)
        before = (
            f"SELECT {self._key_exprs(table)}, \"__dblog_cnt\" FROM ("
            f"SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS \"__dblog_rn\", "
            f"count(*) OVER () AS \"__dblog_cnt\" FROM ("
            f"SELECT {keys} FROM ")
        text = (
            f" WHERE {' AND '.join(cond)} "
            f"ORDER BY {keys} LIMIT %s) AS \"__dblog_chunk\") AS \"__dblog_numbered\" "
            "WHERE \"__dblog_rn\" = \"__dblog_cnt\" "
            "OR (\"__dblog_rn\" * %s) / \"__dblog_cnt\" > ((\"__dblog_rn\" - 1) * %s) / \"__dblog_cnt\" "
            "ORDER BY \"__dblog_rn\"")
        rows = self._query(_stmt(before, table.qualified, text),
                           p.args + [int(size), int(parts), int(parts)])
        return self._plan_from_rows(table, after, rows)

    def range_predicates(self, table: TableSchema, plan: ChunkPlan) -> list[str]:
        """One WHERE predicate per partition, ``bounds[i] < key <= bounds[i+1]``, with
        literals rendered from the plan's bounds (Spark cannot bind parameters).

        Written against ``jdbc_table(table)`` (a key column read through an expression
        is named by its raw alias there); they need standard_conforming_strings=on."""
        cols = self._predicate_columns(table)
        types = self._key_types(table)
        out = []
        for lo, hi in zip(plan.bounds, plan.bounds[1:]):
            if hi is None:
                raise ValueError("a partition's upper bound cannot be None")
            parts = []
            if lo is not None:
                parts.append(key_after(cols, lo, pg_literal, types))
            parts.append(key_upto(cols, hi, pg_literal, types))
            out.append(" AND ".join(parts))
        return out

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
            p = _Params()
            if len(table.key) == 1:
                where = (f"{_qx(table.key[0])} IN ("
                         + ", ".join(p(k[0], types[0]) for k in batch) + ")")
            else:
                tuples = ["(" + ", ".join(p(v, t) for v, t in zip(k, types)) + ")" for k in batch]
                where = f"{_row(table.key, _qx)} IN ({', '.join(tuples)})"
            query = _stmt(f"SELECT {self.select_list(table, _qx)} FROM ", table.qualified,
                          f" WHERE {where}")
            self._append_rows(table, cols, self._query(query, p.args))
        return self._arrow(table, cols)

    def keys_where(self, table: TableSchema, condition: str, limit: int) -> list[tuple]:
        """Keys of the rows matching a user's WHERE condition (parsed strictly, values bound),
        in key order; at most ``limit`` + 1 so the caller can tell it was cut."""
        from ..conditions import parse_condition
        cond = parse_condition(table, condition, _qx)
        query = _stmt(f"SELECT {self._key_exprs(table)} FROM ", table.qualified,
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
        """spark.read.jdbc's ``table``: the quoted ``"schema"."table"``, or a derived
        table of it when some column is read through an expression (select_expr:
        timestamptz, json/jsonb, uuid, time, arrays, unconstrained numeric, ...). A
        key column read through an expression is also selected raw as
        ``raw_key_alias(name)``, which range_predicates use; PostgreSQL pulls the
        sub-select up, so the predicates stay index range scans. Select
        ``table.column_names`` from the result (the aliases are extra columns)."""
        schema = table if isinstance(table, TableSchema) else self.table_schema(table)
        native = self.native_columns(schema.qualified)
        if not any(_needs_expr(native[c]) for c in schema.column_names):
            return quote_table(schema.qualified)
        exprs = [select_expr(native[c]) for c in schema.column_names]
        exprs += [f"{quote_ident(k)} AS {quote_ident(raw_key_alias(k))}"
                  for k in schema.key if _needs_expr(native[k])]
        return f"(SELECT {', '.join(exprs)} FROM {quote_table(schema.qualified)}) AS \"dblog_chunk\""

    # -- the WAL -------------------------------------------------------------------
    def current_resume(self) -> tuple[Position, dict]:
        """The current end of the WAL: Position(0, LSN, 0) and {"lsn": "X/Y"}."""
        (lsn,), = self._query("SELECT pg_current_wal_lsn()::text")
        return Position(0, lsn_to_int(lsn), 0), {"lsn": str(lsn)}

    heartbeat_s = 0.5   # how soon an idle read_log yields Idle

    @property
    def log(self):
        """The slot and publication (sources/pg_log.py), made on first use."""
        if self._log is None:
            from .pg_log import PgLog
            self._log = PgLog(self)
        return self._log

    def prepare_log(self) -> None:
        """Create the publication and the replication slot if missing (before the
        tail's first checkpoint, so no change falls between them)."""
        self.log.prepare()

    def confirm(self, resume: dict) -> None:
        """Everything before ``resume`` is durable: the slot may release it."""
        self.log.confirm(lsn_to_int(resume["lsn"]))

    def drop_log(self) -> None:
        """Drop the replication slot and the publication (a source taken out of CDC)."""
        self.log.drop()

    def read_log(self, resume: dict | None, should_stop: Callable[[], bool]) -> Iterator[LogItem]:
        """Row changes of the configured tables, watermark writes, transaction ends and
        Idle, from ``resume`` (a TxnEnd's resume dict; None: the current end of the WAL)
        through the replication slot (sources/pg_log.py)."""
        if resume is None:
            self.prepare_log()
            _, resume = self.current_resume()
        return self.log.read(lsn_to_int(resume["lsn"]), should_stop, self.heartbeat_s)
