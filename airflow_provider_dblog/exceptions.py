"""Airflow-side exception classes. Engine errors (``engine.errors``) pass through as they are."""
from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException


class DBLogInvalidRequest(AirflowFailException):
    """A dump request (UI params, operator arguments) is invalid: fail at once, no retry,
    before anything touches the source."""


class DBLogConfigNotFound(AirflowFailException):
    """No config file: neither the operator's ``config_path``, the connection, nor $DBLOG_CONFIG."""


class DBLogWindowFailed(AirflowException):
    """A watermark window failed or timed out while a sensor waited for it."""


class DBLogSparkConnectionError(AirflowFailException):
    """The Spark connection is missing or does not resolve to a Spark master (the Spark
    provider would silently fall back to YARN): fail at once, no retry."""


class DBLogVerificationFailed(AirflowFailException):
    """A verification found the target different from its source (and did not repair it):
    the run fails, the report in the task log (a retry would find the same)."""
