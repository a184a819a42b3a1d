"""Another team's DAG, scheduled on dblog's Asset for ``shop.orders``: it runs after each
apply that changed the orders table in the warehouse."""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_provider_dblog.assets import table_asset

ORDERS = table_asset("shop", "shop.orders")

with DAG("example_orders_report", schedule=[ORDERS], start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
         catchup=False, tags=["example", "dblog-consumer"],
         doc_md="Runs whenever dblog applied changes of `shop.orders` to the warehouse.") as dag:

    @task(inlets=[ORDERS])
    def report(*, inlet_events=None, triggering_asset_events=None):
        for asset, events in (triggering_asset_events or {}).items():
            for event in events:
                print(f"{asset.uri} changed: {event.extra}")

    report()
