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


def lake_table_asset(target: str, table: str, uri: str) -> Asset:
    """The Asset of a lake target's table (``uri``: the Delta table's location, or
    ``iceberg://<catalog host:port>/<database>/<namespace>/<table>``): what a consumer that
    reads the lake table schedules on."""
    db, name = table.split(".", 1)
    return Asset(uri=uri, name=f"dblog.{target}.{db}.{name}", group="dblog")


def verify_asset(target: str) -> Asset:
    """The Asset a target's verifications add events to (``DBLogVerifyOperator``): ``extra``
    has the counts per table; a DAG that acts on a verified target schedules on it."""
    return Asset(uri=f"dblog-verify://{target}", name=f"dblog.verify.{target}", group="dblog")


def apply_alias(target: str) -> AssetAlias:
    """The outlet of a target's apply task: it resolves to the table Assets whose rows that
    run changed (``DBLogApplyOperator`` adds one event per changed table)."""
    return AssetAlias(name=f"dblog.apply.{target}", group="dblog")


def apply_ready_asset(target: str, config_path: str, poll_interval: float = 1.0,
                      refire_seconds: float = 60.0) -> Asset:
    """The Asset an event-driven apply DAG is scheduled on (``apply_schedule: event``): its
    AssetWatcher's :class:`~airflow_provider_dblog.triggers.apply_ready.ApplyReadyTrigger`
    adds an event whenever ``target`` has something new to apply."""
    from airflow.sdk import AssetWatcher

    from .triggers.apply_ready import ApplyReadyTrigger

    trigger = ApplyReadyTrigger(config_path=config_path, target=target, poll_interval=poll_interval,
                                refire_seconds=refire_seconds)
    return Asset(uri=f"dblog-ready://{target}", name=f"dblog.ready.{target}", group="dblog",
                 watchers=[AssetWatcher(name=f"dblog_apply_ready__{target}", trigger=trigger)])
