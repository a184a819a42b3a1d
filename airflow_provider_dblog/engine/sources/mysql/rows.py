"""Binlog row images of one table -> rows of logical values and key tuples, through
a converter function generated once per table (``RowConverter``)."""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Sequence

from ...errors import SchemaChangedError, SourceSetupError, UncarriedValueError
from ...schema import TableSchema
from ...values import EPOCH
from .convert import INT_LIMIT, PLAIN_TYPES, SPECIAL_TYPES, fix_negative_time2, to_logical
from .types import INT_BITS, NativeColumn

NO_NAMES: frozenset = frozenset()

# a key value that could not be carried: the key is still told apart from every other
# (no real value of a date or number column is a string starting with "!")
UNCARRIED_KEY = "!uncarried:"

# no codec has this name: mysql-replication then hands a text value over as its bytes
RAW_TEXT = "dblog-undecoded"


def raw_text(columns: Sequence[Any]) -> None:
    """Have mysql-replication hand over the bytes of a rows event's text columns (call before
    ``ev.rows``). It decodes with Python's codec of the charset's name (latin1 as cp1252, which
    lacks five bytes MariaDB's latin1 has), and one undecodable byte fails the whole event,
    hence the tail; RowConverter decodes each value as the server does (types.NativeColumn
    .encoding) and holds only the event of a value it cannot decode."""
    for c in columns:
        if getattr(c, "character_set_name", None) is not None:
            c.character_set_name = RAW_TEXT


def _decoded_here(n: NativeColumn) -> bool:
    """A text column whose bytes (raw_text) the converter decodes in line."""
    return n.logical in ("string", "json") and n.data_type not in SPECIAL_TYPES | {"enum"} \
        and n.charset != "binary"


def _fast_check(n: NativeColumn, var: str) -> str | None:
    """A Python expression true when ``var`` (not None) is already exactly what
    to_logical would return for it (so it is kept as it is), or None when every
    value of the column goes through to_logical."""
    t = n.logical
    if n.data_type == "datetime":
        return f"({var}.__class__ is _datetime and {var}.tzinfo is None)"
    if n.data_type == "timestamp":   # 1970-01-01 00:00:00 is the zero TIMESTAMP
        return f"({var}.__class__ is _datetime and {var}.tzinfo is None and {var} != _EPOCH)"
    if n.data_type == "date":
        return f"{var}.__class__ is _date"
    if n.data_type == "year":
        return f"({var}.__class__ is int and {var} != 1900)"
    if n.data_type in SPECIAL_TYPES:
        return None
    if t in PLAIN_TYPES:
        return f"{var}.__class__ is {PLAIN_TYPES[t].__name__}"
    if t in INT_BITS:
        lim = INT_LIMIT[t]
        return f"({var}.__class__ is int and {-lim} <= {var} < {lim})"
    if t.startswith("decimal("):
        return f"{var}.__class__ is _Decimal"   # to_logical: Decimal(value), an equal Decimal
    return None


class RowConverter:
    """Binlog row images of one table -> (row dict of logical values, key tuple).

    Built once per table: the per-column checks are compiled into one function,
    so the common value (already of its logical type's exact Python type, in range)
    costs one inline type test and anything else goes through ``to_logical``, which
    raises on a type the captured schema does not expect (the table changed).

    A value no target can hold (UncarriedValueError) becomes None in the row, and
    ``errors`` names it; the caller turns the row's event into a held one
    (``Event.error``) and calls ``take_errors``."""
    code_env: dict = {}   # more names the generated function uses (a subclass's)

    def __init__(self, schema: TableSchema, native: dict[str, NativeColumn]):
        self.schema = schema
        self.names = list(schema.column_names)
        self.natives = [native[c] for c in self.names]
        self.has_time = any(n.data_type == "time" for n in self.natives)
        self.errors: list[tuple[str, str]] = []   # (column, why) of the last converted images
        env = {"_slow": self._slow, "_Decimal": decimal.Decimal, "_datetime": dt.datetime,
               "_date": dt.date, "_EPOCH": EPOCH, **self.code_env}
        exec(compile(self._source(), f"<row converter {schema.qualified}>", "exec"), env)
        self.convert = env["convert"]

    def _source(self) -> str:
        """The text of ``convert(values, none_sources, fix_time) -> (row, key)``."""
        pos = {c: i for i, c in enumerate(self.names)}
        vs = [f"v{i}" for i in range(len(self.names))]
        lines = ["def convert(values, none_sources, fix_time):",
                 f"    {', '.join(vs)}{',' if len(vs) == 1 else ''} = values.values()"]
        for i, n in enumerate(self.natives):
            lines += self._column_lines(i, n, vs[i])
        row = ", ".join(f"{self.names[i]!r}: {v}" for i, v in enumerate(vs))
        key = "".join(f"{vs[pos[k]]}, " for k in self.schema.key)
        lines.append(f"    return {{{row}}}, ({key})")
        return "\n".join(lines)

    def _column_lines(self, i: int, n: NativeColumn, v: str) -> list[str]:
        """The generated lines that make ``v``, column ``i``'s value, its logical value."""
        fast = _fast_check(n, v)
        slow = f"{v} = _slow({i}, {v}, none_sources, fix_time)"
        if _decoded_here(n):   # bytes (raw_text) decoded here; a failure: _slow holds it
            return [f"    if {v}.__class__ is bytes:",
                    f"        try: {v} = {v}.decode({n.encoding!r})",
                    f"        except UnicodeDecodeError: {slow}",
                    f"    elif {v} is not None and not {fast}: {slow}"]
        if n.data_type in ("set", "date", "datetime", "timestamp"):
            # None may be an empty set or a zero date (none_sources says which)
            return [f"    if {v} is None: {v} = _slow({i}, None, none_sources, fix_time)",
                    f"    elif not {fast}: {slow}" if fast is not None else f"    else: {slow}"]
        if fast is None:
            return [f"    if {v} is not None: {slow}"]
        return [f"    if {v} is not None and not {fast}: {slow}"]

    def __call__(self, values: dict, none_sources: dict, fix_time) -> tuple[dict, tuple]:
        return self.convert(values, none_sources, fix_time)

    def image(self, values: dict, none_sources: dict, fix_time) -> tuple[dict, tuple, str | None]:
        """(row, key, why): ``why`` names the values that could not be carried (None if all were)."""
        row, key = self.convert(values, none_sources, fix_time)
        if not self.errors:
            return row, key, None
        why, key = self.take_errors(row, key, values)
        return row, key, why

    @staticmethod
    def uncarried_key(key: tuple) -> bool:
        return any(isinstance(v, str) and v.startswith(UNCARRIED_KEY) for v in key)

    def take_errors(self, row: dict, key: tuple, values: dict) -> tuple[str, tuple]:
        """The error text of the last converted image, and its key (a key column that
        could not be carried is named by its raw value); clears ``errors``."""
        why = "; ".join(f"{self.schema.qualified}.{c}: {e}" for c, e in self.errors)
        bad = {c for c, _ in self.errors}
        if bad & set(self.schema.key):
            key = tuple(f"{UNCARRIED_KEY}{values.get(k)!r}" if k in bad else row[k]
                        for k in self.schema.key)
        self.errors = []
        return why, key

    def check_names(self, rows: list, image: str) -> None:
        names = self.names
        for row in rows:
            if list(row[image]) != names:
                got = list(row[image])
                if got and str(got[0]).startswith("UNKNOWN_COL"):
                    raise SourceSetupError(
                        f"the binlog carries no column names for {self.schema.qualified}: "
                        "SET GLOBAL binlog_row_metadata=FULL (and in the server config)")
                raise SchemaChangedError(
                    f"the columns of {self.schema.qualified} changed (ALTER TABLE?): the binlog has "
                    f"{got}, the captured schema {names}; update the capture's schema "
                    "and re-dump the table")

    def fix_time(self, columns: Sequence[Any], time2: int) -> frozenset:
        """Names of the event's TIME(fsp>0) columns (mysql-replication misreads negative ones)."""
        return frozenset(c.name for c in columns if c.type == time2 and getattr(c, "fsp", 0))

    def _slow(self, i: int, value: Any, none_sources: dict, fix_time) -> Any:
        n = self.natives[i]
        name = n.name
        if value is None and n.data_type == "set" and none_sources.get(name) == "empty set":
            value = ""
        elif name in fix_time and isinstance(value, dt.timedelta):
            value = fix_negative_time2(value)
        try:
            return to_logical(n, value, none_sources.get(name) if value is None else None)
        except UncarriedValueError as e:
            self.errors.append((name, str(e)))
            return None
        except (TypeError, ValueError) as e:
            raise SchemaChangedError(
                f"{self.schema.qualified}.{name} ({n.column_type}): {e}; the column's type changed "
                "(ALTER TABLE?): update the capture's schema and re-dump the table") from None
