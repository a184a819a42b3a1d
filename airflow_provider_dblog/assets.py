"""Per-table Assets: ``dblog://<source>/<db>/<table>``, updated after each successful apply."""
from __future__ import annotations

from airflow.sdk import Asset

SCHEME = "dblog"


def table_asset(source: str, table: str) -> Asset:
    """The Asset of one captured table, e.g. ``table_asset("shop", "shop.orders")``."""
    db, name = table.split(".", 1)
    return Asset(uri=f"{SCHEME}://{source}/{db}/{name}", name=f"dblog.{source}.{db}.{name}",
                 group="dblog")
