"""The retry layer of the dump and the apply (engine/retry.py) and what counts as transient.

The servers' own outages are in tests/integration/test_outages_apply_dump.py; here the thin
layers alone: the backoff and budget of ``Retrier``, the classification of errors (built
as the drivers raise them), and the config's checks of the ``retry_for_s`` settings.
"""
from __future__ import annotations

import time

import psycopg2
import psycopg2.errors
import pytest
import redis

from airflow_provider_dblog.engine.config import ConfigError, parse_config
from airflow_provider_dblog.engine.errors import TargetUnavailableError
from airflow_provider_dblog.engine.retry import Retrier, pause_s, redis_is_transient
from airflow_provider_dblog.engine.targets.pg_errors import is_transient as pg_is_transient


class Flaky:
    """A step that raises ``error`` its first ``failures`` calls, then returns "ok"."""

    def __init__(self, error: Exception, failures: int):
        self.error, self.failures, self.calls = error, failures, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def _retrier(retry_for_s: float, seen: list | None = None) -> Retrier:
    return Retrier("apply.retry_for_s", retry_for_s, lambda e: isinstance(e, ConnectionError),
                   TargetUnavailableError, on_retry=(seen.append if seen is not None else lambda e: None))


def test_the_pauses_double_from_half_a_second_to_fifteen():
    assert [pause_s(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_a_transient_failure_is_retried_and_counted():
    seen: list = []
    retry = _retrier(30, seen)
    step = Flaky(ConnectionError("refused"), 2)
    t0 = time.monotonic()
    assert retry.run(step, "apply of t") == "ok"
    assert step.calls == 3 and retry.retries == 2 and len(seen) == 2
    assert 1.4 < time.monotonic() - t0 < 5  # 0.5 + 1.0 s of backoff


def test_any_other_error_is_raised_at_once():
    retry = _retrier(30)
    step = Flaky(ValueError("a bug"), 5)
    with pytest.raises(ValueError, match="a bug"):
        retry.run(step, "apply of t")
    assert step.calls == 1 and retry.retries == 0


def test_past_retry_for_s_it_fails_naming_what_attempts_seconds_and_the_last_error():
    retry = _retrier(0.3)
    step = Flaky(ConnectionError("connection refused"), 100)
    t0 = time.monotonic()
    with pytest.raises(TargetUnavailableError, match=r"^apply of t: gave up after 2 failed attempt\(s\) over 0s "
                                                     r"\(apply.retry_for_s 0.3\): ConnectionError: connection refused$"):
        retry.run(step, "apply of t")
    assert time.monotonic() - t0 < 1.5  # the last pause ends at the deadline, not a whole pause past it


def test_the_budget_counts_from_the_start_of_each_outage():
    retry = _retrier(0.6)
    assert retry.run(Flaky(ConnectionError("x"), 1), "a") == "ok"   # one outage of 0.5 s
    assert retry.run(Flaky(ConnectionError("x"), 1), "b") == "ok"   # a new one: a new budget
    assert retry.retries == 2


@pytest.mark.parametrize("error, transient", [
    (psycopg2.OperationalError("connection to server at \"127.0.0.1\", port 15432 failed: Connection refused"), True),
    (psycopg2.OperationalError("server closed the connection unexpectedly"), True),
    (psycopg2.InterfaceError("connection already closed"), True),
    (psycopg2.DatabaseError("no COPY in progress"), True),
    (ConnectionResetError(), True),
    (psycopg2.OperationalError('FATAL:  password authentication failed for user "dblog"'), False),
    (psycopg2.OperationalError('FATAL:  role "nobody" does not exist'), False),
    (psycopg2.OperationalError("FATAL:  no pg_hba.conf entry for host"), False),
    (psycopg2.errors.NumericValueOutOfRange("smallint out of range"), False),  # (no SQLSTATE when built here)
    (psycopg2.ProgrammingError("syntax error"), False),
    (ValueError("a bug"), False),
])
def test_what_the_postgres_target_retries(error, transient):
    assert pg_is_transient(error) is transient


@pytest.mark.parametrize("error, transient", [
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:16379. Connection refused."), True),
    (redis.TimeoutError("Timeout reading from socket"), True),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
    (psycopg2.OperationalError("server closed the connection unexpectedly"), False),
])
def test_what_counts_as_redis_being_away(error, transient):
    assert redis_is_transient(error) is transient


class _Java:
    """A Java exception as py4j shows it: class name, SQLSTATE (SQLException only), cause."""

    def __init__(self, name: str, state: str | None = None, cause: "_Java | None" = None):
        self.name, self.state, self.cause = name, state, cause

    def getClass(self):
        return type("Class", (), {"getName": lambda _: self.name})()

    def getSQLState(self):
        if self.state is None:
            from py4j.protocol import Py4JError
            raise Py4JError("no such method")
        return self.state

    def getCause(self):
        return self.cause


class _Py4JJavaError(Exception):
    def __init__(self, java):
        self.java_exception = java


@pytest.mark.parametrize("chain, transient", [
    (_Java("org.apache.spark.SparkException", None, _Java("java.sql.SQLNonTransientConnectionException", "08000",
                                                          _Java("java.net.ConnectException"))), True),
    (_Java("java.sql.SQLException", "08S01"), True),  # MariaDB: the server went away mid-read
    (_Java("org.apache.spark.SparkException", None, _Java("java.io.EOFException")), True),
    (_Java("java.sql.SQLSyntaxErrorException", "42S22"), False),  # an unknown column
    (_Java("org.apache.spark.SparkException", None, _Java("java.lang.ArithmeticException")), False),
])
def test_a_spark_chunk_select_is_retried_only_when_the_jvm_lost_its_connection(chain, transient):
    pytest.importorskip("py4j")
    from spark_jobs.dump_job import jvm_connection_error

    assert jvm_connection_error(_Py4JJavaError(chain)) is transient
    assert jvm_connection_error(ValueError("not from the JVM")) is False


@pytest.mark.parametrize("section, value", [
    ("apply", 0), ("apply", -1), ("apply", "soon"), ("apply", True),
    ("dump", 0), ("dump", "5"), ("tail", 0), ("tail", -3.5),
])
def test_retry_for_s_must_be_a_positive_number_of_seconds(section, value):
    raw = {"sources": {"s": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["a.b"]}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"}, section: {"retry_for_s": value}}
    with pytest.raises(ConfigError, match=rf"{section}.retry_for_s must be a number of seconds > 0, not"):
        parse_config(raw, env={})


def test_retry_for_s_defaults_and_settings():
    raw = {"sources": {"s": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["a.b"]}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"}}
    cfg = parse_config(raw, env={})
    assert (cfg.apply.retry_for_s, cfg.dump.retry_for_s, cfg.tail.retry_for_s) == (300, 300, 300)
    cfg = parse_config(raw | {"apply": {"retry_for_s": 2.5}, "dump": {"retry_for_s": 60}}, env={})
    assert (cfg.apply.retry_for_s, cfg.dump.retry_for_s) == (2.5, 60)


@pytest.mark.parametrize("changes", [0, 1, 5, 6])
def test_a_chunk_whose_table_changed_shape_is_redone_at_once_then_left_to_the_backoff(changes):
    """DumpRunner: a chunk is selected again at once after each change of its table's shape (no
    pause, counted in chunks_redone), SHAPE_REDOS times in a row; one more goes to the retrier."""
    from types import SimpleNamespace

    from airflow_provider_dblog.engine import dump
    from airflow_provider_dblog.engine.errors import ChunkShapeChangedError
    assert dump.SHAPE_REDOS == 5
    counted = []

    class Runner:
        state = SimpleNamespace(incr=counted.append)
        left = changes

        def _one_chunk(self, rid, more=False):
            if self.left:
                self.left -= 1
                raise ChunkShapeChangedError(f"{rid}: t changed shape")
            return True
    if changes <= dump.SHAPE_REDOS:
        assert dump.DumpRunner._one_chunk_in_its_shape(Runner(), "r1") is True
        assert counted == ["chunks_redone"] * changes
    else:
        with pytest.raises(ChunkShapeChangedError):
            dump.DumpRunner._one_chunk_in_its_shape(Runner(), "r1")
        assert counted == ["chunks_redone"] * dump.SHAPE_REDOS
