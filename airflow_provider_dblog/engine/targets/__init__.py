"""Apply targets: the contract (base.py) and its implementations. ``open_target`` picks
the implementation from the config's kind; nothing outside this package imports one."""
from __future__ import annotations

import logging

from ..config import TargetConfig
from .base import OP_COLUMN, POS_COLUMN, MergeResult, Target
from .pg_tables import stage_table_name, target_table_name
from .postgres import PostgresTarget

__all__ = ["MergeResult", "OP_COLUMN", "POS_COLUMN", "PostgresTarget", "Target", "name_clashes", "open_target",
           "stage_table_name", "target_table_name"]

log = logging.getLogger(__name__)
CHANGELOG_SUFFIX = "__changelog"   # a changelog table's name: its table's + this (changelog.py)


def name_clashes(tables, changelog: bool, target: str = "") -> dict[str, dict]:
    """{table: its held apply result} of the source tables a target cannot keep apart: two
    whose target names are one (``a.b__c`` and ``a__b.c``), and, on a target that keeps
    changelog tables, one whose name is another's changelog table (that name is the
    changelog's). Those tables are held on the target, named; the others go on."""
    by_name: dict[str, list[str]] = {}
    for t in tables:
        by_name.setdefault(target_table_name(t), []).append(t)
    why = {}
    for name, same in by_name.items():
        if len(same) > 1:
            why |= {t: f"{t}: its target table {name} would also hold {', '.join(o for o in same if o != t)}'s "
                       f"rows; capture one of them under another name (a view or a rename) or in another target"
                    for t in same}
        owner = by_name.get(name.removesuffix(CHANGELOG_SUFFIX)) if name.endswith(CHANGELOG_SUFFIX) else None
        if changelog and owner:
            why |= {t: f"{t}: its target table {name} is the changelog table of {owner[0]} on this target; "
                       f"capture it into a target without changelog tables, or rename it" for t in same}
    for t, w in why.items():
        log.error("apply of %s to %s held: %s", t, target, w)
    zero = dict.fromkeys(("files", "events", "rows", "inserted", "updated", "deleted", "stale"), 0)
    return {t: zero | {"status": "held", "held": {"at": "", "error": w}} for t, w in why.items()}


def open_target(config: TargetConfig) -> Target:
    if config.kind == "postgres":
        return PostgresTarget(config)
    if config.kind == "delta":
        from .delta import DeltaTarget   # deltalake is needed only by a Delta target
        return DeltaTarget(config)
    if config.kind == "iceberg":
        from .iceberg import IcebergTarget   # pyiceberg is needed only by an Iceberg target
        return IcebergTarget(config)
    raise NotImplementedError(f"target kind {config.kind!r} is not supported yet")
