"""Whether a MariaDB/MySQL column type change (information_schema COLUMN_TYPE, as each
schema version records it) kept every value of the column, where its logical type alone
cannot say (engine/schema_evolution.py).

Some changes round or strip values silently, whatever the session's mode: a coarser
fractional-second precision (DATETIME(6) -> DATETIME), a FLOAT/DOUBLE given or given a
smaller (M,D), VARCHAR into CHAR (trailing spaces stripped), BINARY padding. Others
change values only where the statement ran without strict mode (a strict one fails
instead): into UNSIGNED (negatives clamp), a shorter length, a smaller TEXT/BLOB, ENUM/SET
labels removed, any change between text types, ENUM and SET. ``True``: kept; ``False``:
may have changed (also any other change of the kind of type); ``None``: the logical type
decides (integer display widths, ZEROFILL, a DECIMAL's digits, FLOAT into DOUBLE). Nothing here imports Airflow.
"""
from __future__ import annotations

import re

STRICT_MODES = (1 << 21) | (1 << 22)   # sql_mode bits STRICT_TRANS_TABLES, STRICT_ALL_TABLES

_INT = re.compile(r"(tinyint|smallint|mediumint|int|integer|bigint)(?:\(\d+\))?( unsigned)?( zerofill)?")
_FSP = re.compile(r"(datetime|timestamp|time)(?:\((\d)\))?")
_FLOAT = re.compile(r"(float|double|real)(?:\((\d+),(\d+)\))?( unsigned)?( zerofill)?")
_LENGTH = re.compile(r"(varchar|char|varbinary|binary|bit)\((\d+)\)")
_LOB = {f"{size}{kind}": i for kind in ("text", "blob")
        for i, size in enumerate(("tiny", "", "medium", "long"))}
_LABELS = re.compile(r"(enum|set)\((.*)\)")
_DECIMAL = re.compile(r"decimal\(\d+,\d+\)( unsigned)?( zerofill)?")


def _text_family(t: str) -> bool:
    return bool(re.fullmatch(r"(var)?char\(\d+\)|(tiny|medium|long)?text|(enum|set)\(.*\)", t))


def strict(sql_mode: int | None) -> bool:
    """Whether a statement ran in strict mode (a binlog Query event's sql_mode; None:
    not known, taken as strict, MariaDB's default)."""
    return sql_mode is None or bool(int(sql_mode) & STRICT_MODES)


def _labels(text: str) -> list[str]:
    return re.findall(r"'((?:[^']|'')*)'", text)


def mysql_widens(old: str, new: str, strict_mode: bool = True) -> bool | None:
    if old == new:
        return True
    o, n = _INT.fullmatch(old), _INT.fullmatch(new)
    if o and n:
        return False if (n.group(2) and not o.group(2) and not strict_mode) else None
    o, n = _FSP.fullmatch(old), _FSP.fullmatch(new)
    if o and n:
        return o.group(1) == n.group(1) and int(n.group(2) or 0) >= int(o.group(2) or 0)
    o, n = _FLOAT.fullmatch(old), _FLOAT.fullmatch(new)
    if o and n:
        if n.group(2) and (not o.group(2) or int(n.group(3)) < int(o.group(3))
                           or int(n.group(2)) - int(n.group(3)) < int(o.group(2)) - int(o.group(3))):
            return False   # rounded to D digits, whatever the mode
        return False if (n.group(4) and not o.group(4) and not strict_mode) else None
    o, n = _LENGTH.fullmatch(old), _LENGTH.fullmatch(new)
    if o and n:
        same_kind = o.group(1) == n.group(1) or (o.group(1), n.group(1)) in (("char", "varchar"),
                                                                             ("binary", "varbinary"))
        if not same_kind:
            return False   # VARCHAR into CHAR strips trailing spaces; BINARY pads
        return int(n.group(2)) >= int(o.group(2)) or strict_mode
    if old in _LOB and new in _LOB and old[-4:] == new[-4:]:
        return _LOB[new] >= _LOB[old] or strict_mode
    if (o := _LENGTH.fullmatch(old)) and o.group(1) in ("varchar", "char") and new in _LOB and new.endswith("text"):
        return True   # a longer text type; CHAR's values were read without their padding
    o, n = _LABELS.fullmatch(old), _LABELS.fullmatch(new)
    if o and n and o.group(1) == n.group(1):
        return set(_labels(o.group(2))) <= set(_labels(n.group(2))) or strict_mode
    if _DECIMAL.fullmatch(old) and _DECIMAL.fullmatch(new):
        return None
    if _text_family(old) and _text_family(new):
        return strict_mode   # between text types, ENUM and SET: a value that does not fit fails or converts
    return False   # another kind of type under the same logical one: not known to keep values
