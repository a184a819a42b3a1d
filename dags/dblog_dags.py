"""dblog's DAGs for the config in $DBLOG_CONFIG (default: the demo's config).

See dblog_factory.py for the DAGs it builds. Airflow puts this folder on sys.path.
"""
from __future__ import annotations

import os
from pathlib import Path

import airflow_provider_dblog.devenv
from dblog_factory import build_dags

CONFIG = os.environ.get("DBLOG_CONFIG") or str(Path(airflow_provider_dblog.devenv.__file__).parent / "demo.yaml")

globals().update(build_dags(CONFIG))
