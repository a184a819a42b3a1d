"""What a table's targets do at a change of its shape, by the table's behaviour (the
source's ``schema_changes`` setting, for all its tables or per table, like Flink CDC's):

============  ==========================  ==========================  ==================  ==========
change        evolve (default)            lenient                     ignore              fail
============  ==========================  ==========================  ==================  ==========
add column    target adds it (nullable;   target adds it              not carried         tail stops
              existing rows: the source's
              default)
drop column   target drops it             kept, frozen                kept, frozen        tail stops
rename        target renames it           new column added with the   old kept, frozen;   tail stops
                                          old one's values; old kept  new not carried
widen type    target widens it            target widens it            quarantine          tail stops
TRUNCATE      target emptied              target keeps its rows       target keeps rows   tail stops
============  ==========================  ==========================  ==================  ==========

"Kept, frozen": the target keeps the column; rows that existed at the change keep the
value they had, rows inserted after it hold null there (the merge writes only the
source's columns). Widening: a wider integer (TINYINT < SMALLINT < INT < BIGINT), a
DECIMAL / NUMERIC with at least as many digits on each side of the point, or one without
limits; on PostgreSQL, whose versions give each column's type with its modifier
(``native_widens``), also a longer varchar(n) / varbit(n) (or one without a limit) and a
finer time / timestamp / interval precision. Any other change of a type modifier may have
rewritten the values at the source without row events (a scale or precision that shrank,
char(n) padded again, bit(n), ``TYPE ... USING`` into another modifier): it quarantines.
A column dropped and added again under the same name between two versions (PostgreSQL: a
new attnum under the name; the log showed no version without it) quarantines as well: the
source reset its values at a point the log does not show.

Whatever the behaviour, the change quarantines the table (engine/quarantine.py)
when no row event carries what it did to existing rows and the source cannot say it: a
column added with a default the source evaluated per row (CURRENT_TIMESTAMP, a volatile
function), NOT NULL without one, or generated (``ignore`` takes it, not carrying the
column). A constant default is carried: the tail records the value existing rows hold
(MariaDB/MySQL: a literal DEFAULT, read from the server as the column's type; PostgreSQL:
``pg_attribute.attmissingval``, the value it gives rows older than the column), and the
target adds the column with it for its existing rows. Also quarantined: a narrowing or other type change, a change of the key, and under ``ignore`` a
widening (the target keeps its type, which new values may not fit).

An apply takes a table's changes one at a time, in position order: its batch ends at the
next version that changes the table's shape, and the merge that moves the target's
checkpoint there runs the target's DDL in the same transaction, so a target's shape is
always the one holding at its checkpoint. Nothing here imports Airflow.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .arrow_values import decode_row
from .logical_types import DECIMAL_TYPE, NUMERIC_TYPE
from .mysql_widening import mysql_widens
from .schema import TableSchema

EVOLVE, LENIENT, IGNORE, FAIL = "evolve", "lenient", "ignore", "fail"
BEHAVIOURS = (EVOLVE, LENIENT, IGNORE, FAIL)

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


@dataclass(frozen=True)
class Evolution:
    """A change of a table's shape as its targets take it (every tuple holds column names)."""
    behaviour: str = EVOLVE
    add: tuple[str, ...] = ()                  # the target adds it, null in existing rows (unless filled)
    drop: tuple[str, ...] = ()                 # the target drops it
    keep: tuple[str, ...] = ()                 # gone at the source, kept (frozen) in the target
    rename: tuple[tuple[str, str], ...] = ()   # (old, new): the target's column renamed
    copy: tuple[tuple[str, str], ...] = ()     # (old, new): new added with the old one's values
    retype: tuple[tuple[str, str], ...] = ()   # (column, wider logical type)
    skip: tuple[str, ...] = ()                 # new at the source, not carried (ignore)
    reordered: bool = False
    problems: tuple[str, ...] = ()             # why the targets cannot follow it
    fill: tuple[str, ...] = ()                 # added columns whose existing rows hold a default
    fill_values: str = ""                      # that value of each (arrow_values.encode_row)
    truncate: bool = False                     # TRUNCATE: the target is emptied there
    truncated_ts: int = 0                      # its source time (ms; 0: not recorded)

    @property
    def compatible(self) -> bool:
        return not self.problems

    @property
    def changed(self) -> bool:
        """The logical shape changed (an apply's batch ends before it)."""
        return bool(self.add or self.drop or self.keep or self.rename or self.copy or self.retype
                    or self.skip or self.reordered or self.problems or self.truncate)

    def describe(self) -> str:
        parts = [f"{what} {', '.join(cols)}" for what, cols in (
            ("existing rows given the default of", self.fill),
            ("added", self.add), ("dropped", self.drop), ("kept (dropped at the source)", self.keep),
            ("not carried", self.skip)) if cols]
        parts += [f"renamed {a} to {b}" for a, b in self.rename]
        parts += [f"{b} added with {a}'s values" for a, b in self.copy]
        parts += [f"{c} widened to {t}" for c, t in self.retype]
        parts += ["columns reordered"] if self.reordered else []
        parts += ["emptied (TRUNCATE)"] if self.truncate else []
        return "; ".join(parts + list(self.problems)) or "no change to its columns"


def parse_setting(value, tables: tuple[str, ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A source's ``schema_changes`` setting: one behaviour for all its tables, or a mapping
    of tables (and ``default``) to behaviours -> (default, ((table, behaviour), ...))."""
    if not isinstance(value, dict):
        value = {"default": value}
    for table, behaviour in value.items():
        if table != "default" and table not in tables:
            raise ValueError(f"{table!r} is not one of the source's tables ({', '.join(tables)})")
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"{table}: must be one of {', '.join(BEHAVIOURS)}, not {behaviour!r}")
    return value.get("default", EVOLVE), tuple((t, b) for t, b in value.items() if t != "default")


# a source type's modifier as PostgreSQL's format_type prints it: "character varying(20)",
# "timestamp(3) without time zone", "interval(2)", with "[]" for an array
_LENGTHS = re.compile(r"(character varying|bit varying)(?:\((\d+)\))?(\[\])?")
_PRECISIONS = re.compile(r"(timestamp|time|interval)(?:\((\d+)\))?( with(?:out)? time zone)?(\[\])?")


def native_widens(old: str, new: str) -> bool:
    """Every value of source type ``old`` is a value of ``new``, unchanged (PostgreSQL's
    format_type text): a longer or unlimited varchar / varbit, varchar into text, a finer
    (or the default, 6) time / timestamp / interval precision."""
    if old == new:
        return True
    o, n = _LENGTHS.fullmatch(old), _LENGTHS.fullmatch(new)
    if o and (n or new == "text" and o.group(1) == "character varying" and not o.group(3)):
        if new == "text":
            return True
        return (o.group(1), o.group(3)) == (n.group(1), n.group(3)) and (
            not n.group(2) or bool(o.group(2)) and int(n.group(2)) >= int(o.group(2)))
    o, n = _PRECISIONS.fullmatch(old), _PRECISIONS.fullmatch(new)
    if o and n and (o.group(1), o.group(3), o.group(4)) == (n.group(1), n.group(3), n.group(4)):
        return int(n.group(2) or 6) >= int(o.group(2) or 6)
    return False


def widens(old: str, new: str) -> bool:
    """Every value of logical type ``old`` is a value of ``new``, unchanged."""
    if old.startswith("text:") and new.startswith("text:"):
        return native_widens(old[5:], new[5:])
    if old in _INT_BITS and new in _INT_BITS:
        return _INT_BITS[new] >= _INT_BITS[old]
    o = DECIMAL_TYPE.match(old) or NUMERIC_TYPE.match(old)
    n = DECIMAL_TYPE.match(new) or NUMERIC_TYPE.match(new)
    if not (o and n and o.group(1)):
        return False
    if not n.group(1):
        return new == "numeric"   # unbounded
    (p, s), (p2, s2) = (int(o.group(1)), int(o.group(2))), (int(n.group(1)), int(n.group(2)))
    return s2 >= s and p2 - s2 >= p - s


def evolution(old: TableSchema, new: TableSchema, behaviour: str = EVOLVE,
              defaults: dict[str, object] | None = None,
              renamed: list[tuple[str, str]] | tuple = (), fill_values: str = "",
              truncated: bool = False, native: dict[str, tuple[str, str]] | None = None,
              recreated: tuple[str, ...] | list = (), mysql_native: bool = False, strict: bool = True) -> Evolution:
    """How the targets take the change from ``old`` to ``new`` under ``behaviour``.
    ``defaults``: the new columns' defaults as the source reports them (a default gives
    existing rows a value no event carries); ``renamed``: (old, new) column names the
    source says were renamed (:func:`renames`); ``fill_values``: the value existing rows
    of added columns hold, where the source could say (``added_column_fill``); ``truncated``:
    the table was emptied there (TRUNCATE: the target is emptied too under ``evolve``;
    ``lenient`` and ``ignore`` keep its rows); ``native``: {column: (old, new)} source types
    with their modifiers where they differ (PostgreSQL); ``recreated``: columns dropped and
    added again under their name (:func:`recreated_columns`); ``mysql_native``: those types
    are MariaDB/MySQL's (engine/mysql_widening.py), changed by a statement run in ``strict``
    mode or not (without it, a column made NOT NULL turned NULLs into values, unlogged)."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"schema_changes must be one of {', '.join(BEHAVIOURS)}, not {behaviour!r}")
    defaults = defaults or {}
    old_cols, new_cols = {c.name: c for c in old.columns}, {c.name: c for c in new.columns}
    renamed = [(a, b) for a, b in renamed if a in old_cols and a not in new_cols and b in new_cols
               and b not in old_cols]
    renamed_old, renamed_new = {a for a, _ in renamed}, {b for _, b in renamed}
    problems: list[str] = []
    add, drop, keep, rename, copy, retype, skip = [], [], [], [], [], [], []
    filled = set(decode_row(fill_values).column_names) if fill_values else set()
    if old.key != new.key:
        problems.append(f"the primary key changed from ({', '.join(old.key)}) to ({', '.join(new.key)})")
    for a, b in renamed:
        if old_cols[a].type != new_cols[b].type:
            problems.append(f"column {a} was renamed to {b} and changed type")
        elif behaviour == EVOLVE:
            rename.append((a, b))
        elif behaviour == LENIENT:
            copy.append((a, b))
            keep.append(a)
        else:
            keep.append(a)
            skip.append(b)
    for n in old_cols:
        if n not in new_cols and n not in renamed_old:
            (drop if behaviour == EVOLVE else keep).append(n)
    native = native or {}
    for n in recreated:
        problems.append(f"column {n} was dropped and added again (the source reset its values) at a point "
                        "the log does not show")
    for n, c in old_cols.items():
        if n in recreated or n not in new_cols:
            continue
        t = new_cols[n].type
        if c.nullable and not new_cols[n].nullable and not strict:
            problems.append(f"column {n} was made NOT NULL by a statement run without strict mode: its NULLs "
                            "became values at the source without row events")
        if t == c.type and n not in native:
            continue
        # the source's own types (modifiers) say whether values were kept
        if mysql_native:
            kept = mysql_widens(*native[n], strict) if n in native else None
            ok = kept is not False and (widens(c.type, t) if t != c.type else True)
        else:
            ok = widens(c.type, t) if t != c.type else native_widens(*native[n])
        if not ok:
            shown = t == c.type or c.type.startswith("text:") or (mysql_native and widens(c.type, t))
            was, now = native[n] if n in native and shown else (c.type, t)   # the types that tell why
            problems.append(f"column {n} changed type from {was} to {now} (not a widening: values "
                            "may have changed at the source without row events)")
        elif t == c.type:
            continue
        elif behaviour == IGNORE:
            problems.append(f"column {n} was widened from {c.type} to {t}, and schema_changes 'ignore' "
                            "keeps the target's type, which new values may not fit")
        else:
            retype.append((n, t))
    for n, c in new_cols.items():
        if n in old_cols or n in renamed_new:
            continue
        if behaviour == IGNORE:
            skip.append(n)
        elif n in filled:
            add.append(n)
        elif not c.nullable:
            problems.append(f"column {n} was added NOT NULL (existing rows hold a value no row event carries)")
        elif defaults.get(n) is not None:
            problems.append(f"column {n} was added with a default ({defaults[n]}): existing rows hold it, "
                            "and no row event carries it")
        else:
            add.append(n)
    common_old = [n for n in old.column_names if n in new_cols]
    common_new = [n for n in new.column_names if n in old_cols]
    fill = tuple(n for n in add if n in filled)
    ev = Evolution(behaviour, tuple(add), tuple(drop), tuple(keep), tuple(rename), tuple(copy), tuple(retype),
                   tuple(skip), common_old != common_new, tuple(problems), fill, fill_values if fill else "",
                   truncated and behaviour == EVOLVE)
    if behaviour == FAIL and ev.changed:
        return Evolution(FAIL, problems=(f"{new.qualified} changed ({ev.describe()}) and its schema_changes "
                                         "setting is 'fail'",))
    return ev


def renames(old_version: dict, new_version: dict, ddl_renamed: list | tuple = ()) -> list[tuple[str, str]]:
    """The (old, new) column renames between two stored versions: by the columns' identity
    where the source gives one (PostgreSQL's attnum: a renamed column keeps it), else as
    the DDL statement said (MySQL/MariaDB: RENAME COLUMN, CHANGE)."""
    old_ids = (old_version.get("extra") or {}).get("attnums")
    new_ids = (new_version.get("extra") or {}).get("attnums")
    if old_ids and new_ids:
        by_id = {i: n for n, i in new_ids.items()}
        return [(n, by_id[i]) for n, i in old_ids.items() if i in by_id and by_id[i] != n]
    return [tuple(p) for p in ddl_renamed]


def native_changes(old_version: dict, new_version: dict) -> dict[str, tuple[str, str]]:
    """{column: (old, new)} of the columns whose source type with its modifier differs
    between two versions, where the source records it (PostgreSQL's ``formatted``,
    MariaDB/MySQL's ``column_type``)."""
    old = {n["name"]: n.get("formatted") or n.get("column_type") for n in old_version.get("native") or ()}
    new = {n["name"]: n.get("formatted") or n.get("column_type") for n in new_version.get("native") or ()}
    return {c: (old[c], new[c]) for c in old if old[c] and new.get(c) and old[c] != new[c]}


def recreated_columns(old_version: dict, new_version: dict) -> tuple[str, ...]:
    """Columns under the same name with another identity (PostgreSQL's attnum): dropped and
    added again between the two versions."""
    old_ids = (old_version.get("extra") or {}).get("attnums") or {}
    new_ids = (new_version.get("extra") or {}).get("attnums") or {}
    return tuple(n for n, i in old_ids.items() if n in new_ids and new_ids[n] != i)


def version_evolution(previous: dict, version: dict) -> Evolution:
    """The evolution the tail recorded with ``version`` (its behaviour and renames), from
    the version before it."""
    ev = evolution(TableSchema.from_dict(previous["schema"]), TableSchema.from_dict(version["schema"]),
                     version.get("behaviour", EVOLVE), (version.get("extra") or {}).get("defaults"),
                     version.get("renamed") or (), version.get("fill", ""), bool(version.get("truncated")),
                     native_changes(previous, version), recreated_columns(previous, version),
                     mysql_native=any("column_type" in n for n in version.get("native") or ()),
                     strict=not version.get("non_strict"))
    return replace(ev, truncated_ts=int(version.get("truncated_ts") or 0)) if ev.truncate else ev


def added_with_values(old: TableSchema, new: TableSchema, defaults: dict, renamed) -> list[str]:
    """The columns added from ``old`` to ``new`` whose existing rows hold a value (a
    default, NOT NULL): the tail asks the source what that value is."""
    renamed_new = {b for _, b in renamed}
    return [c.name for c in new.columns if c.name not in old.column_names and c.name not in renamed_new
            and (defaults.get(c.name) is not None or not c.nullable)]


def kept_name_reused(ev: Evolution, before: TableSchema, after: TableSchema, target_columns: set[str],
                     fold_case: bool = False) -> str:
    """A name the target cannot give a column the change brings, because a column it keeps
    (gone at the source, kept by ``lenient`` / ``ignore``) holds it: under ``ignore``, a
    column not carried (added, or renamed to) under a kept column's name (writing the new one
    into it would mix their values); on a target whose names ignore case (``fold_case``:
    Delta), a column added, copied or renamed to a kept column's name but for case
    (``lenient``'s ``v`` kept beside a copied ``V``). Why, for a quarantine that a full dump
    releases (the target table rebuilt in the new shape); "" if none. (Two source columns
    alike but for case are the target's own refusal: lake_schema.check_shape.)"""
    if ev.behaviour == IGNORE:
        clash = [n for n in ev.skip if n in target_columns and n not in before.column_names]
        return (f"column {', '.join(clash)} added at the source under the name of a column the target keeps "
                "from before (dropped or renamed away there, kept by schema_changes: ignore): the target cannot "
                "hold both under one name") if clash else ""
    if not fold_case:
        return ""
    kept = target_columns - {a for a, _ in ev.rename} - set(ev.drop) - set(after.column_names)
    folded = {c.lower(): c for c in kept}
    clash = [n for n in [*ev.add, *(b for _, b in ev.copy), *(b for _, b in ev.rename)] if n.lower() in folded]
    return (f"column {', '.join(clash)} would share its name with {', '.join(folded[n.lower()] for n in clash)}, "
            "which the target keeps (schema_changes: lenient), on a target whose column names ignore case"
            ) if clash else ""
