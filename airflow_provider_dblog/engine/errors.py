"""Exception classes of the engine. Each names one way a CDC run can fail closed."""


class DBLogError(Exception):
    """Base class for every error raised by the engine."""


class ConfigError(DBLogError):
    """The YAML config is missing a field, has a wrong value, or names an unknown thing."""


class SourceSetupError(DBLogError):
    """The source is not set up for CDC (binlog format, row image, privileges, ...)."""


class UnknownTableError(DBLogError):
    """A table that is not in the source, or not configured for capture."""


class NoPrimaryKeyError(DBLogError):
    """A table without a primary key cannot be chunked or reconciled."""


class InvalidKeyError(DBLogError):
    """A primary-key value given by a user does not match the table's key columns."""


class WatermarkError(DBLogError):
    """Watermarks seen out of order, twice, or from an unknown run."""


class WindowTimeoutError(WatermarkError):
    """A watermark window did not close in time (is the tail running?)."""


class ChunkInFlightError(DBLogError):
    """Another chunk of the same dump request is between its LW and its completion."""


class SchemaChangedError(DBLogError):
    """The table's columns or primary key changed under a capture; a re-dump is needed."""


class ChunkShapeChangedError(SchemaChangedError):
    """A dump chunk's table changed shape inside its window, or the runner selected it in a
    shape other than the one holding at its HW: the chunk is redone in the new shape."""


class DumpCancelledError(DBLogError):
    """A dump was cancelled by its cancel flag."""


class DumpPausedError(DBLogError):
    """A dump stopped at a chunk boundary because its pause flag is set."""


class LeaseLostError(DBLogError):
    """This tail (or dump runner) lost its lease: it must stop without writing."""


class StateLostError(DBLogError):
    """The source's Redis state is gone (flushed, restored, a new instance) while its event
    store shows an earlier history: starting at the log head would skip changes silently."""


class LogGapError(DBLogError):
    """The log the checkpoint resumes from is gone (a purged binlog, a dropped or advanced
    replication slot): the changes in between cannot be read any more."""


class SourceUnavailableError(DBLogError):
    """The source (or Redis) stayed away longer than the configured retry time."""


class TargetUnavailableError(DBLogError):
    """The apply's target (or Redis) stayed away longer than ``apply.retry_for_s``."""


class TablesNotAppliedError(DBLogError):
    """Some tables of an apply run failed (each for its own reason); the others were applied."""

    def __init__(self, message: str, results: dict):
        super().__init__(message)
        self.results = results   # every table's result, {"status": "failed", "error"} for those


class RequestBusyError(DBLogError):
    """Another runner holds the dump request's lease: one runner per request."""


class UncarriedValueError(DBLogError, ValueError):
    """A value that no target could hold exactly (a MySQL zero date, a timestamp past
    Arrow's range, a NUL character for a PostgreSQL text column). It never becomes a
    silent NULL: the event says so, and the table's apply holds before it."""


class ZeroDateError(UncarriedValueError):
    """A MySQL zero date (or one with a zero part): carried as NULL only when the source's
    ``zero_dates`` setting says so."""


class TargetValueError(UncarriedValueError):
    """A value one target cannot hold exactly (a date past what a lake table's readers
    hold: engine/targets/lake_values.py), though the event log carries it. Never clamped:
    that table's apply to that target is held (its checkpoint stays, the result says
    ``"status": "held"`` with this message) while other tables and targets go on; a later
    change of the row at the source lets it pass."""

    def __init__(self, message: str, table: str = "", column: str = "", value: str = "", at: str = ""):
        super().__init__(message)
        self.table, self.column, self.value, self.at = table, column, value, at

    def held(self) -> dict:
        """The ``held`` entry of the table's apply result."""
        return {"at": self.at, "error": str(self)}


class TargetShapeError(TargetValueError):
    """A table whose shape one target cannot hold exactly (a lake table: two column names one
    format takes as one, a key it cannot match or identify by): that table is held on that
    target (the run's other tables and targets go on) until its shape or the config changes."""


class VerificationError(DBLogError):
    """A verification cannot compare a table: its target has not applied up to the chunks'
    HW in time (its apply not running, the table held or quarantined), or names another
    source."""
