"""The test suite's Spark standalone cluster (importable as ``spark_cluster``): the devenv's
(``airflow_provider_dblog/devenv/spark_cluster.py``) plus what a test asserts with it.
Each application writes its own event log (``spark_conf``), which says on which executor
each task ran."""
from __future__ import annotations

import json
from pathlib import Path

from airflow_provider_dblog.devenv.spark_cluster import StandaloneCluster
from helpers import spark_submit_opts


class TestCluster(StandaloneCluster):
    __test__ = False  # not a test class, whatever pytest's name rules say

    def spark_conf(self, events_dir: Path) -> dict:
        """A dblog config's ``spark`` section for this cluster, each application writing its
        event log (one plain JSON-lines file) under ``events_dir``."""
        return {"master": self.url, "executor_memory": "512m", "executor_cores": 1,
                "conf": {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events_dir}",
                         "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false",
                         # the executors' JVMs start quicker too (the driver's: tests/conftest.py)
                         "spark.executor.extraJavaOptions": spark_submit_opts(build_cds=False)}}

    @staticmethod
    def tasks_by_executor(events_dir: Path, app_id: str) -> dict[str, int]:
        """From the application's own event log: how many tasks each executor ran."""
        out: dict[str, int] = {}
        with open(Path(events_dir) / app_id) as f:
            for line in f:
                e = json.loads(line)
                if e.get("Event") == "SparkListenerTaskEnd":
                    executor = e["Task Info"]["Executor ID"]
                    out[executor] = out.get(executor, 0) + 1
        return out

    def assert_ran_here(self, events_dir: Path, app_id: str, name: str) -> None:
        """The application registered with this master and finished, the workers ran its
        executors, and every one of its tasks ran on one of those (none in the driver)."""
        app = self.applications().get(app_id)
        assert app is not None, f"{app_id} never registered with {self.url}: {sorted(self.applications())}"
        assert app["name"] == name and app["state"] == "FINISHED", app
        executors = self.executors_of(app_id)
        assert len(executors) == self.n_workers, executors
        tasks = self.tasks_by_executor(events_dir, app_id)
        assert tasks and "driver" not in tasks, tasks
        assert set(tasks) <= {str(e["id"]) for e in executors}, (tasks, executors)

