"""A captured table as the binlog reader decodes it, and two checks that the shape it
holds is the one the log has: the catalog read at an ALTER TABLE must be the statement's
result (not a later change's), and each rows event's columns, as its TABLE_MAP gives them
(binlog_row_metadata=FULL), must be the ones the shape decodes."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...errors import SchemaChangedError
from ...schema import TableSchema
from .ddl import TableStatement, literal_default
from .types import NativeColumn, prints_as


@dataclass(frozen=True)
class CapturedTable:
    schema: TableSchema
    native: dict[str, NativeColumn]
    transactional: bool   # its engine rolls back (see catalog.TRANSACTIONAL_ENGINES)
    defaults: dict[str, str] = field(default_factory=dict)   # catalog.CatalogTable.defaults
    create: str = ""   # its SHOW CREATE TABLE (catalog.CatalogTable.create)


def catalog_past_statement(old: CapturedTable, new: CapturedTable, st: TableStatement) -> str:
    """Why the catalog's shape ``new`` cannot be the one an ALTER TABLE gave the table
    (shaped ``old`` before it): the tail reads the catalog when it gets to the statement,
    and a later change of the table may already be there. "" when it matches: the columns
    the statement adds, drops and renames, the columns it leaves alone unchanged, and the
    DEFAULT literals of the columns it adds."""
    altered = st.altered
    expected = altered.columns_after(old.schema.column_names)
    found = {c.lower() for c in new.schema.column_names}
    if expected != found:
        return f"columns {sorted(found)} where the statement leaves {sorted(expected)}"
    touched = {c.lower() for c in altered.defined} | {b.lower() for _, b in altered.renamed}
    before = {c.lower(): n for c, n in old.native.items()}
    for name, native in new.native.items():
        prior = before.get(name.lower())
        if name.lower() not in touched and prior is not None and prior != native:
            return f"column {name} is {native.column_type}, was {prior.column_type}, and the statement leaves it"
    for column, value in altered.defaults.items():
        text = next((d for c, d in new.defaults.items() if c.lower() == column.lower()), None)
        known, now = literal_default(text) if text is not None else (True, None)
        if not known or now != value:
            return f"column {column} was added with DEFAULT {value!r}, and the catalog's default is {text}"
    return ""


# the binlog's column type codes (mysql-replication's FIELD_TYPE) each catalog type is
# logged as, with binlog_row_metadata=FULL
_LOGGED_AS = {"tinyint": {1}, "smallint": {2}, "mediumint": {9}, "int": {3}, "integer": {3}, "bigint": {8},
              "decimal": {246}, "float": {4}, "double": {5}, "date": {10, 14}, "datetime": {18, 12},
              "timestamp": {17, 7}, "time": {19, 11}, "year": {13}, "char": {254}, "varchar": {15, 253},
              "binary": {254}, "varbinary": {15, 253}, "enum": {247, 254}, "set": {248, 254}, "bit": {16},
              "json": {245, 252}}
_LOB_LENGTH = {"tiny": 1, "": 2, "medium": 3, "long": 4}
_DECIMAL = re.compile(r"decimal\((\d+)(?:,(\d+))?\)")


def _logged_problem(native: NativeColumn, col: Any) -> str:
    """Why the binlog's TABLE_MAP metadata of a column (``col``) is not the column the
    shape decodes it as (``native``), or ""."""
    dt, logged = native.data_type, int(col.type)
    lob = re.fullmatch(r"(tiny|medium|long|)(text|blob)", dt)
    if lob:
        if logged != 252 or getattr(col, "length_size", None) != _LOB_LENGTH[lob.group(1)]:
            return "another text/blob size"
    elif dt in _LOGGED_AS and logged not in _LOGGED_AS[dt]:
        return f"binlog type {logged}"
    if dt in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint") and \
            bool(getattr(col, "unsigned", False)) != ("unsigned" in native.column_type):
        return "another signedness"
    m = _DECIMAL.fullmatch(native.column_type.split()[0]) if dt == "decimal" else None
    if m and (getattr(col, "precision", None), getattr(col, "decimals", 0) or 0) != (int(m.group(1)), int(m.group(2) or 0)):
        return f"decimal({col.precision},{col.decimals or 0})"
    if dt == "enum" and getattr(col, "enum_values", None) and list(col.enum_values[1:]) != list(native.set_values):
        return f"enum values {col.enum_values[1:]}{_unread_labels(native, col.enum_values[1:])}"
    if dt == "set" and getattr(col, "set_values", None) and list(col.set_values) != list(native.set_values):
        return f"set values {col.set_values}{_unread_labels(native, col.set_values)}"
    if dt == "bit" and getattr(col, "bits", None) not in (None, native.length):
        return f"bit({col.bits})"
    collation = getattr(col, "collation_name", None)
    if collation and native.charset and collation.split("_")[0] != native.charset.split("_")[0]:
        return f"collation {collation}"
    return ""


def _unread_labels(native: NativeColumn, logged: Sequence[str]) -> str:
    """Why the labels read differ from the logged ones when only as the catalog prints them."""
    if len(logged) == len(native.set_values) and all(map(prints_as, logged, native.set_values)):
        return (" (the catalog prints each character outside the BMP as '?', and the server did not give "
                "the true labels: catalog._true_labels)")
    return ""


def logged_shape_problem(captured: CapturedTable, columns: Sequence[Any]) -> str:
    """Why a rows event's columns, as its TABLE_MAP gives them, are not the shape the
    reader decodes the table with (a change the reader did not see as a statement, or a
    catalog read past it), or "": names, then each column's type, signedness, precision,
    enum / set values, bit width and character set."""
    names = [c.name for c in columns]
    if names != list(captured.schema.column_names):
        return ""   # the names check says it, with the names (RowConverter.check_names)
    for col in columns:
        native = captured.native.get(col.name)
        problem = _logged_problem(native, col) if native is not None else ""
        if problem:
            return (f"column {col.name} is logged as {problem}, and the shape the reader holds says "
                    f"{native.column_type}")
    return ""


def check_binlog_key(schema: TableSchema, primary_key: Any) -> None:
    """SchemaChangedError if a rows event names another primary key than the schema's."""
    if not primary_key:  # no key metadata (e.g. a prefix key): nothing to compare
        return
    key = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
    if set(key) != set(schema.key):
        raise SchemaChangedError(
            f"the primary key of {schema.qualified} is now ({', '.join(key)}), was "
            f"({', '.join(schema.key)}): update the capture's schema and re-dump the table")
