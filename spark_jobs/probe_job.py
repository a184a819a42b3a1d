"""Where do the jobs run? A tiny job on the configured master (``dblog check --spark``).

    spark-submit ... probe_job.py --config dblog.yaml

Reports the master and the application id the driver got, the executors that ran its
tasks (not the driver), the Python the executors run (``spark.pyspark.python``), and
whether the storage root is shared: the executors write a small Parquet dataset under
it and the driver reads it back (chunk selects and applies need exactly that). Reports
as every job does (the job result protocol, ``spark_jobs/common.py``).
"""
from __future__ import annotations

import posixpath
import sys
import uuid
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import job_parser, load, read_parquet_arrow, run_job, spark_session, to_uri  # noqa: E402


def _where(_):
    """On an executor: its host and Python (a Python worker of the executor)."""
    import socket
    import sys as s
    yield socket.gethostname(), s.executable, f"{s.version_info.major}.{s.version_info.minor}"


def main(argv: list[str] | None = None) -> dict:
    p = job_parser("probe_job", __doc__, source=False)
    p.add_argument("--partitions", type=int, default=4)
    args = p.parse_args(argv)
    cfg = load(args.config)
    spark = spark_session("dblog-probe")
    try:
        sc = spark.sparkContext
        probe_uri = posixpath.join(to_uri(cfg.storage_root), "probe", uuid.uuid4().hex)
        # written by the executors (one file per partition), read back by the driver
        (spark.range(0, 1000, numPartitions=args.partitions)
         .write.mode("overwrite").parquet(probe_uri))
        rows = read_parquet_arrow(probe_uri).num_rows
        pythons = sorted(set(sc.parallelize(range(args.partitions), args.partitions)
                             .mapPartitions(_where).collect()))
        # the status tracker lists the driver's block manager too: leave exactly it out
        jsc = sc._jsc.sc()
        bm = jsc.env().blockManager().blockManagerId()
        driver = f"{bm.host()}:{bm.port()}"
        executors = [f"{e.host()}:{e.port()}" for e in jsc.statusTracker().getExecutorInfos()]
        executors = [e for e in executors if e != driver]
        try:
            import pyarrow.fs as pafs
            fs, path = pafs.FileSystem.from_uri(probe_uri)
            fs.delete_dir(path)
        except Exception:  # noqa: BLE001 - a leftover probe directory is harmless
            pass
        return {"master": sc.master, "app_id": sc.applicationId, "app_name": sc.appName,
                "deploy_mode": sc.getConf().get("spark.submit.deployMode", "client"),
                "default_parallelism": sc.defaultParallelism, "executors": executors,
                "local_mode": sc.master.startswith("local"),
                "executor_python": [{"host": h, "python": e, "version": v} for h, e, v in pythons],
                "storage_root": cfg.storage_root, "storage_shared": rows == 1000}
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(run_job(main))
