"""A table's shape from information_schema: its TableSchema, the NativeColumn of
each column, and its storage engine."""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pymysql

from ...errors import SourceSetupError, UnknownTableError
from ...schema import Column, TableSchema
from .sql import quote_ident, quote_table
from .types import (NativeColumn, add_decode_table, bit_length, check_charset, has_decode_table,
                    logical_type, prints_as, set_members)

# engines that roll back (MyISAM, Aria, MEMORY do not: their rows stay written when
# the transaction around them rolls back)
TRANSACTIONAL_ENGINES = {"innodb", "xtradb", "rocksdb", "tokudb"}

Query = Callable[[str, Sequence[Any]], list[tuple]]

log = logging.getLogger(__name__)


# a DEFAULT that is a constant as information_schema shows it (MariaDB quotes strings;
# an expression such as current_timestamp() is not one)
LITERAL_DEFAULT = re.compile(r"'(?:[^']|'')*'|[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|b'[01]*'|0x[0-9A-Fa-f]+")


@dataclass(frozen=True)
class CatalogTable:
    schema: TableSchema
    native: dict[str, NativeColumn]
    engine: str   # ENGINE, lower case (see TRANSACTIONAL_ENGINES)
    # the columns that give a row a value of their own: a DEFAULT other than NULL (its SQL
    # text) or GENERATED (engine/schema_history.py: such a column added has values no
    # row event carries)
    defaults: dict[str, str]
    # SHOW CREATE TABLE as the columns were read ("" if it changed meanwhile): where the
    # shape after a later ALTER can be computed from (shape_replay.py)
    create: str = ""


def read_table(query: Query, table: str, source_name: str, zero_as_null: bool) -> CatalogTable:
    """The shape of ``table`` ("db.name"); UnknownTableError if it is not a base table,
    SourceSetupError for a column type that cannot be carried, NoPrimaryKeyError. Read
    again (three times at most) while a DDL changes the table during the read (its SHOW
    CREATE TABLE before and after differ), so that the create text goes with the shape.
    SourceSetupError too for a definition the server prints as bytes that are not UTF-8 (its
    utf8mb4 takes an encoded surrogate, ENUM(x'eda080'), which Python's codec refuses)."""
    for _ in range(3):
        try:
            found = _read_table(query, table, source_name, zero_as_null)
        except UnicodeDecodeError as e:
            raise SourceSetupError(f"{table}: its definition holds text that is not UTF-8 ({e}); change the "
                                   "column (a label or comment with an encoded surrogate?)") from None
        if found.create:
            break
    return found


def _read_table(query: Query, table: str, source_name: str, zero_as_null: bool) -> CatalogTable:
    db, _, name = table.partition(".")
    kind = query("SELECT TABLE_TYPE, ENGINE FROM information_schema.TABLES "
                 "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, name))
    if not kind:
        raise UnknownTableError(f"table {table} does not exist in source {source_name!r}")
    if kind[0][0] != "BASE TABLE":
        raise UnknownTableError(f"{table} is a {kind[0][0].lower()}, not a table: only base "
                                "tables have row events in the binlog")
    create = show_create(query, table)
    cols = query(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, "
        "NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_OCTET_LENGTH, CHARACTER_SET_NAME, "
        "COLUMN_DEFAULT, EXTRA "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION", (db, name))
    key = [r[0] for r in query(
        "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
        "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (db, name))]
    json_cols = _json_check_columns(query, db, name)
    columns, native, defaults = [], {}, {}
    for cname, dtype, ctype, nullable, prec, scale, fsp, octets, charset, default, extra in cols:
        if "GENERATED" in str(extra or "").upper():
            defaults[cname] = f"GENERATED ({extra})"
        elif default is not None and str(default).upper() != "NULL":   # MariaDB: 'NULL' = DEFAULT NULL
            defaults[cname] = str(default)
        members = set_members(str(ctype))   # ENUM/SET labels keep their case: values are compared with them
        dtype, ctype = str(dtype).lower(), str(ctype).lower()
        try:
            logical = logical_type(dtype, ctype, prec, scale, cname in json_cols)
            check_charset(str(charset or "").lower())
        except ValueError as e:
            raise SourceSetupError(f"{table}.{cname}: {e}") from None
        length = 0
        if dtype == "binary":
            length = int(octets or 0)
        elif dtype == "bit":
            length = bit_length(ctype)
        native[cname] = NativeColumn(cname, dtype, ctype, logical,
                                     fsp=int(fsp or 0) if dtype == "time" else 0,
                                     length=length, set_values=members,
                                     charset=str(charset or "").lower(),
                                     zero_as_null=zero_as_null)
        columns.append(Column(cname, logical, nullable == "YES"))
    labels_read = _true_labels(query, table, native)
    for k in key:   # rows two labels alike tell apart would be one row of the target
        labels = native[k].set_values if k in native and native[k].data_type in ("enum", "set") else ()
        if len(set(labels)) != len(labels):
            raise SourceSetupError(
                f"{table}.{k}: a key column with labels that read alike ({list(labels)}): rows that differ "
                "only in which of them they hold could not be told apart; make its labels distinct")
    try:
        schema = TableSchema(db, name, tuple(columns), tuple(key))  # NoPrimaryKeyError if no key
    except ValueError as e:   # its columns and its key read apart while a DDL ran between
        raise SourceSetupError(f"the shape of {table} could not be read consistently ({e})") from None
    return CatalogTable(schema, native, str(kind[0][1] or "").lower(), defaults,
                        create if labels_read and show_create(query, table) == create else "")


# character sets that hold characters outside the BMP: information_schema (utf8mb3) and
# SHOW CREATE TABLE print each such character of an ENUM / SET label as one '?' (of a
# CHARACTER SET binary label, read as UTF-8 as the dump reads it: one '?' for each byte)
_WIDE_CHARSETS = {"utf8mb4", "utf16", "utf16le", "utf32", "binary"}


def _true_labels(query: Query, table: str, native: dict[str, NativeColumn]) -> bool:
    """Replace in ``native`` the ENUM / SET labels the catalog printed with a '?' that may
    stand for a character outside the BMP by the true ones, each the server's own text of
    the label's number (ENUM index, SET bit) for a variable of the column's type (MariaDB's
    TYPE OF, in an anonymous block: a read, with the SELECT privilege the dump needs).
    False when a label read is not one the catalog printed (the table changed meanwhile:
    read again). A server that cannot say (MySQL has no TYPE OF) leaves the printed labels:
    the binlog's TABLE_MAP has the true ones, so rows events of the table break it, loud
    (captured.logged_shape_problem), never a wrong label."""
    wanted = [(c, i) for c, n in native.items() if n.data_type in ("enum", "set") and n.charset in _WIDE_CHARSETS
              for i, m in enumerate(n.set_values) if "?" in m]
    if not wanted:
        return True
    db, _, name = table.partition(".")
    declare = " ".join(
        f"DECLARE l{k} TYPE OF {quote_ident(db)}.{quote_ident(name)}.{quote_ident(c)} "
        f"DEFAULT {i + 1 if native[c].data_type == 'enum' else 1 << i};" for k, (c, i) in enumerate(wanted))
    select = ", ".join(f"HEX(CONVERT(l{k} USING utf8mb4))" for k in range(len(wanted)))
    try:
        rows = query(f"BEGIN NOT ATOMIC {declare} SELECT {select}; END")
        found = [bytes.fromhex(h).decode("utf-8") for h in rows[0]]
    except (pymysql.MySQLError, IndexError, TypeError, ValueError) as e:
        log.warning("%s: the true labels of its ENUM / SET columns printed with '?' could not be read (%s); "
                    "rows events with a label outside the BMP will break the table", table, e)
        return True
    labels = {c: list(n.set_values) for c, n in native.items()}
    for (c, i), label in zip(wanted, found):
        if not prints_as(label, labels[c][i], 4 if native[c].charset == "binary" else 1):
            return False
        labels[c][i] = label
    for c in {c for c, _ in wanted}:
        native[c] = dataclasses.replace(native[c], set_values=tuple(labels[c]))
    return True


NO_SUCH_TABLE = 1146


def show_create(query: Query, table: str) -> str:
    """SHOW CREATE TABLE's text; UnknownTableError when the table is gone (a RENAME or DROP
    between this and the catalog reads before it: the same as gone before them)."""
    try:
        rows = query(f"SHOW CREATE TABLE {quote_table(table)}")
    except pymysql.err.ProgrammingError as e:
        if e.args and e.args[0] == NO_SUCH_TABLE:
            raise UnknownTableError(f"table {table} no longer exists (renamed or dropped while read)") from None
        raise
    return str(rows[0][1]) if rows else ""


def _json_check_columns(query: Query, db: str, name: str) -> set[str]:
    """MariaDB's JSON is LONGTEXT with a CHECK (json_valid(col)) constraint."""
    try:
        rows = query("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                     "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (db, name))
    except pymysql.MySQLError:  # MySQL: no TABLE_NAME there, and JSON is a real type
        return set()
    out = set()
    for (clause,) in rows:
        m = re.fullmatch(r"\s*json_valid\(\s*`((?:[^`]|``)+)`\s*\)\s*", str(clause), re.I)
        if m:
            out.add(m.group(1).replace("``", "`"))
    return out


_single_byte: set[str] | None = None   # the server's single-byte character sets, read once


def server_decode_table(query: Query, charset: str) -> list[str | None]:
    """The text the server gives for each byte 0..255 of ``charset`` converted to utf8mb4
    (one SELECT of 256 values: MariaDB and MySQL)."""
    if not re.fullmatch(r"[a-z0-9_]+", charset):
        raise ValueError(f"not a character set name: {charset!r}")
    cols = ", ".join(f"CONVERT(CHAR({b} USING {charset}) USING utf8mb4)" for b in range(256))
    return list(query(f"SELECT {cols}", ())[0])


def load_decode_tables(query: Query, charsets) -> None:
    """Register the server's decode table of each single-byte character set among
    ``charsets`` not yet registered in this process (latin1 keeps types.MARIADB_LATIN1)."""
    global _single_byte
    wanted = {c for c in charsets if c and c not in ("binary", "latin1") and not has_decode_table(c)}
    if not wanted:
        return
    if _single_byte is None:
        _single_byte = {str(r[0]).lower() for r in query(
            "SELECT CHARACTER_SET_NAME FROM information_schema.CHARACTER_SETS WHERE MAXLEN = 1", ())}
    for charset in sorted(wanted & _single_byte):
        add_decode_table(charset, server_decode_table(query, charset))
