"""Local development environment: private MariaDB / PostgreSQL / Redis servers.

Nothing here imports Airflow. See :mod:`airflow_provider_dblog.devenv.servers`
and ``bootstrap.sh`` next to this file.
"""
