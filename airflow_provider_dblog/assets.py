"""Per-table Assets: ``dblog://<source>/<db>/<table>``, with an event each time an apply
changed the table's target rows (through the apply task's AssetAlias, so a run that changed
nothing wakes no consumer)."""
from __future__ import annotations

from airflow.sdk import Asset, AssetAlias

SCHEME = "dblog"


def table_asset(source: str, table: str) -> Asset:
    """The Asset of one captured table, e.g. ``table_asset("shop", "shop.orders")``."""
    db, name = table.split(".", 1)
    return Asset(uri=f"{SCHEME}://{source}/{db}/{name}", name=f"dblog.{source}.{db}.{name}",
                 group="dblog")


def apply_alias(target: str) -> AssetAlias:
    """The outlet of a target's apply task: it resolves to the table Assets whose rows that
    run changed (``DBLogApplyOperator`` adds one event per changed table)."""
    return AssetAlias(name=f"dblog.apply.{target}", group="dblog")
