"""Row images from mysql-event-stream (the compiled binlog decoder) -> logical values.

The decoder gives each value in one documented form per column type; ``mes_form`` turns
the forms ``to_logical`` does not take as they are into ones it does, so that the rules
of what a value becomes stay in one place (convert.to_logical, shared with the other
reader and with the dump):

* ENUM: its 1-based index (0: the '' of a bad value) -> the label;
* SET: its bit mask -> the members in declaration order, comma-joined;
* an unsigned BIGINT or BIT(64) above 2**63-1: its exact decimal text -> int;
* DECIMAL: its exact text -> Decimal (NUMERIC past 38 digits keeps the text);
* TIMESTAMP: decimal seconds since the epoch -> the UTC datetime (0: the zero TIMESTAMP);
* text of any character set: UTF-8 with surrogateescape, so ``encode("utf-8",
  "surrogateescape")`` gives back the stored bytes, decoded as the server does
  (NativeColumn.encoding): a value invalid in its charset is held, not guessed.

DATE / DATETIME text (zero dates too) and TIME text are taken by to_logical as they are.
"""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from ...errors import SchemaChangedError, SourceSetupError, UncarriedValueError
from ...values import EPOCH
from .convert import INT_LIMIT, decode_text, to_logical
from .rows import NO_NAMES, RowConverter
from .types import INT_BITS, NativeColumn


def _epoch(text: str) -> dt.datetime:
    seconds, _, frac = text.partition(".")
    return EPOCH + dt.timedelta(seconds=int(seconds), microseconds=int(frac.ljust(6, "0")) if frac else 0)


def _text_value(n: NativeColumn, value: str) -> str:
    if n.encoding == "utf-8" and (value.isascii() or _clean(value)):
        return value
    return decode_text(n, value.encode("utf-8", "surrogateescape"))


def _clean(value: str) -> bool:
    """No stray byte (a lone surrogate from surrogateescape) in a UTF-8 value."""
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _members(n: NativeColumn, mask: int) -> str:
    if mask >> len(n.set_values):
        raise ValueError(f"SET bits {mask:b} past the column's {len(n.set_values)} members")
    return ",".join(m for i, m in enumerate(n.set_values) if mask >> i & 1)


def _label(n: NativeColumn, index: int) -> str:
    if not 0 <= index <= len(n.set_values):
        raise ValueError(f"ENUM index {index} past the column's {len(n.set_values)} labels")
    return n.set_values[index - 1] if index else ""


def mes_form(n: NativeColumn, value: Any) -> Any:
    """A mysql-event-stream value of column ``n`` in a form to_logical takes."""
    cls, t = value.__class__, n.data_type
    if t == "enum" and cls is int:
        return _label(n, value)
    if t == "set":   # a mask past 2**63-1 (a 64th member) comes as its exact text
        return _members(n, int(value) if cls is str else value)
    if t == "timestamp" and cls is str:
        return _epoch(value)
    if cls is str:
        if t == "bit" or n.logical in INT_BITS:   # past the signed 64-bit range: exact text
            return int(value)
        if n.logical.startswith("decimal("):
            return decimal.Decimal(value)
        if t not in ("time", "date", "datetime") and not n.logical.startswith("numeric"):
            return _text_value(n, value)
    return value


def _fast_check(n: NativeColumn, var: str) -> str | None:
    """A Python expression true when ``var`` (not None) is already its logical value."""
    t, logical = n.data_type, n.logical
    if t in ("enum", "set", "bit", "year", "float", "binary", "time", "date", "datetime", "timestamp"):
        return None
    if logical in INT_BITS:
        lim = INT_LIMIT[logical]
        return f"({var}.__class__ is int and {-lim} <= {var} < {lim})"
    if logical in ("string", "json") and n.encoding == "utf-8":
        return f"({var}.__class__ is str and ({var}.isascii() or _clean({var})))"
    if logical == "float64":
        return f"{var}.__class__ is float"
    if logical == "binary":
        return f"{var}.__class__ is bytes"
    return None


class MesRowConverter(RowConverter):
    """RowConverter for mysql-event-stream's row dicts (``image(values, {}, NO_NAMES)``)."""
    code_env = {"_clean": _clean}

    def _column_lines(self, i: int, n: NativeColumn, v: str) -> list[str]:
        fast = _fast_check(n, v)
        slow = f"{v} = _slow({i}, {v}, none_sources, fix_time)"
        if n.logical.startswith("decimal(") and n.data_type != "bit":
            return [f"    if {v}.__class__ is str: {v} = _Decimal({v})", f"    elif {v} is not None: {slow}"]
        if fast is None:
            return [f"    if {v} is not None: {slow}"]
        return [f"    if {v} is not None and not {fast}: {slow}"]

    def _slow(self, i: int, value: Any, none_sources: dict, fix_time) -> Any:
        n = self.natives[i]
        try:
            return to_logical(n, mes_form(n, value))
        except UncarriedValueError as e:
            self.errors.append((n.name, str(e)))
            return None
        except (TypeError, ValueError, decimal.InvalidOperation) as e:
            raise SchemaChangedError(
                f"{self.schema.qualified}.{n.name} ({n.column_type}): {e}; the column's type changed "
                "(ALTER TABLE?): update the capture's schema and re-dump the table") from None

    def check_keys(self, values: dict, resolved: bool) -> None:
        """The decoder's row dict has the captured columns, in order."""
        if list(values) != self.names:
            if not resolved:
                raise SourceSetupError(
                    f"the binlog carries no column names for {self.schema.qualified}: "
                    "SET GLOBAL binlog_row_metadata=FULL (and in the server config)")
            raise SchemaChangedError(
                f"the columns of {self.schema.qualified} changed (ALTER TABLE?): the binlog has "
                f"{list(values)}, the captured schema {self.names}; update the capture's schema "
                "and re-dump the table")


__all__ = ["MesRowConverter", "mes_form", "NO_NAMES"]
