"""Benchmark harness for airflow-provider-dblog (issue 5).

Every figure is a ratio against a baseline measured in the same run, on the same
data: dump vs a raw Spark JDBC read, tail vs a bare log decoder, log lag and
application write latency with vs without a dump, and commit-to-target freshness.
Run ``python -m bench --help`` (``make bench`` sets the environment).
"""
