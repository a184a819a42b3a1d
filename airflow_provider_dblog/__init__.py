"""airflow-provider-dblog: DBLog watermark change-data capture for Airflow and Spark.

The engine (``airflow_provider_dblog.engine``) does not import Airflow; the
provider's hooks, operators, sensors and triggers wrap it.
"""
__version__ = "0.1.0"


def get_provider_info() -> dict:
    """What Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-provider-dblog",
        "name": "DBLog",
        "description": "Watermark-based change-data capture (Netflix DBLog) for MySQL/MariaDB and "
                       "PostgreSQL, with chunked dumps on Spark and idempotent apply.",
        "versions": [__version__],
        "connection-types": [
            {"connection-type": "dblog",
             "hook-class-name": "airflow_provider_dblog.hooks.dblog.DBLogHook",
             "hook-name": "DBLog",
             # declarative form fields (Airflow >= 3.2): the UI renders them without
             # importing the hook, and without Flask-AppBuilder / wtforms
             "conn-fields": {"config_path": {
                 "label": "Config file (YAML)",
                 "description": "Path of the dblog config on the workers and the triggerer; "
                                "its sources and targets name their own connections (conn_id).",
                 "schema": {"type": ["string", "null"]}}},
             "ui-field-behaviour": {
                 "hidden-fields": ["host", "schema", "login", "password", "port"],
                 "relabeling": {},
                 "placeholders": {"config_path": "/opt/dblog/dblog.yaml"}}},
        ],
        "hooks": [{"integration-name": "DBLog",
                   "python-modules": ["airflow_provider_dblog.hooks.dblog"]}],
        "operators": [{"integration-name": "DBLog", "python-modules": [
            "airflow_provider_dblog.operators.spark",
            "airflow_provider_dblog.operators.tail",
            "airflow_provider_dblog.operators.chunk",
            "airflow_provider_dblog.operators.dump",
            "airflow_provider_dblog.operators.reconcile",
            "airflow_provider_dblog.operators.apply",
            "airflow_provider_dblog.operators.maintain",
            "airflow_provider_dblog.operators.verify",
        ]}],
        "sensors": [{"integration-name": "DBLog", "python-modules": [
            "airflow_provider_dblog.sensors.watermark",
            "airflow_provider_dblog.sensors.lag",
        ]}],
        "triggers": [{"integration-name": "DBLog", "python-modules": [
            "airflow_provider_dblog.triggers.watermark",
            "airflow_provider_dblog.triggers.lag",
        ]}],
        "integrations": [{"integration-name": "DBLog", "external-doc-url":
                          "https://arxiv.org/abs/2010.12597", "tags": ["software"]}],
    }
