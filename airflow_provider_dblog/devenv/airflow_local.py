"""A local Airflow on the private servers: its environment, ``airflow dags test`` runs
for the demo, and ``airflow standalone`` for the UI (``make airflow``).

Metadata is SQLite under ``.dblog-local/airflow``. SQLite takes one writer at a time,
so the demo runs the continuous tail DAG with a home of its own next to the others.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import sqlite_metadata
from .servers import default_base

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"


def airflow_env(config_path: str, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlite_metadata.url(home / "airflow.db"),
        **sqlite_metadata.settings(),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # local development only
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "DBLOG_CONFIG": str(Path(config_path).resolve()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TZ": "UTC",
        "PYSPARK_PYTHON": sys.executable,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }


def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def migrate(env: dict[str, str]) -> None:
    subprocess.run([airflow_bin(), "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    sqlite_metadata.use_wal(Path(env["AIRFLOW_HOME"]) / "airflow.db")


class LocalAirflow:
    def __init__(self, config_path: str, name: str = "airflow"):
        self.env = airflow_env(config_path, default_base() / name)
        migrate(self.env)

    def start_dag_test(self, dag_id: str, conf: dict | None = None, log_path: Path | None = None) -> subprocess.Popen:
        cmd = [airflow_bin(), "dags", "test", dag_id]
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        out = open(log_path, "w") if log_path else subprocess.DEVNULL
        return subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def dag_test(self, dag_id: str, conf: dict | None = None) -> tuple[bool, str]:
        """Run one DAG run to its end; (all tasks succeeded, the run's output)."""
        cmd = [airflow_bin(), "dags", "test", dag_id]
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        res = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=3600)
        out = res.stdout + res.stderr
        finished = [ln for ln in out.splitlines() if "DagRun Finished" in ln]
        return res.returncode == 0 and bool(finished) and "state=success" in finished[-1], out


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_provider_dblog.devenv.airflow_local standalone CONFIG``"""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2 or args[0] != "standalone":
        print("usage: python -m airflow_provider_dblog.devenv.airflow_local standalone CONFIG")
        return 2
    env = airflow_env(args[1], default_base() / "airflow")
    migrate(env)
    print(f"Airflow UI on http://localhost:8080 (AIRFLOW_HOME={env['AIRFLOW_HOME']}, "
          f"DAGs from {DAGS}, config {env['DBLOG_CONFIG']})", flush=True)
    os.execve(airflow_bin(), [airflow_bin(), "standalone"], env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
