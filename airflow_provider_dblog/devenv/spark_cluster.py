"""A Spark standalone cluster of the installed pyspark, on loopback: one master and N
workers, each a ``spark-class`` daemon with its own ports, work directory and log,
stopped (the whole process group) at the end. The tests and the benchmark
(``--spark-cluster``) run the Spark jobs on it as on a user's cluster; its master's and
workers' JSON status pages say which applications registered and which executors ran
for them.

Command line (a cluster to point ``spark.master`` at, until Ctrl-C)::

    python -m airflow_provider_dblog.devenv.spark_cluster [--workers 2] [--cores 1] [--memory 1g]

Only the standard library and the installed pyspark (its ``bin/spark-class``; Java).
No Airflow import."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark
    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not path.exists():
        raise RuntimeError(f"{path} missing: the installed pyspark has no spark-class")
    return str(path)


class StandaloneCluster:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.workdir = Path(workdir)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.procs: list[subprocess.Popen] = []
        self.worker_ui_ports: list[int] = []

    def _daemon(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(self.workdir),
                   SPARK_WORKER_DIR=str(self.workdir / "work"), SPARK_DAEMON_MEMORY="512m",
                   SPARK_NO_DAEMONIZE="1")
        proc = subprocess.Popen([spark_class(), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)   # its own group: stop() takes its JVM down
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 120) -> "StandaloneCluster":
        """Start the daemons and wait until every worker is ALIVE in the master; on any
        failure, stop what started and raise."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> "StandaloneCluster":
        self._daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                "--port", str(self.port), "--webui-port", str(self.ui_port)])
        for i in range(self.n_workers):
            ui = free_port()
            self.worker_ui_ports.append(ui)
            work = self.workdir / f"worker{i}"
            work.mkdir(exist_ok=True)
            self._daemon(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", self.url,
                                        "--host", "127.0.0.1", "--port", str(free_port()),
                                        "--webui-port", str(ui), "--cores", str(self.cores),
                                        "--memory", self.memory, "--work-dir", str(work)])
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited (code {p.returncode}); see {self.workdir}")
            try:
                alive = [w for w in self.master_status().get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) == self.n_workers:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark cluster did not come up in {timeout:.0f}s; see {self.workdir}")
            time.sleep(0.5)

    def master_status(self) -> dict:
        """The master's JSON status page: workers, active and completed applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def worker_status(self) -> list[dict]:
        out = []
        for port in self.worker_ui_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as r:
                out.append(json.loads(r.read()))
        return out

    def applications(self) -> dict[str, dict]:
        """Every application the master saw, active or completed, by id."""
        st = self.master_status()
        return {a["id"]: a for a in st.get("activeapps", []) + st.get("completedapps", [])}

    def executors_of(self, app_id: str) -> list[dict]:
        """The executors the workers ran for an application (running or finished)."""
        return [e for w in self.worker_status() for e in w.get("executors", []) + w.get("finishedexecutors", [])
                if e.get("appid") == app_id]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_provider_dblog.devenv.spark_cluster",
                                description="a Spark standalone cluster on loopback, until Ctrl-C")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cores", type=int, default=1, help="cores per worker")
    p.add_argument("--memory", default="1g", help="memory per worker")
    p.add_argument("--dir", default=None, help="work directory (default: a new temporary one)")
    a = p.parse_args(argv)
    workdir = Path(a.dir or tempfile.mkdtemp(prefix="dblog-spark-cluster-"))
    cluster = StandaloneCluster(workdir, a.workers, a.cores, a.memory)
    try:
        cluster.start()
        print(f"spark.master: {cluster.url}  (master UI http://127.0.0.1:{cluster.ui_port}, logs {workdir})",
              flush=True)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # after start: the daemons keep default handlers
        signal.sigwait(stop)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
