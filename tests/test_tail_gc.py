"""The tail turns the automatic cyclic GC off while it holds batches and collects by hand
(engine/tail.py): it must give the GC back as it found it, whatever happens, and still
free cyclic garbage while it runs."""
from __future__ import annotations

import gc
import weakref

import pytest

from airflow_provider_dblog.engine.config import TailConfig
from airflow_provider_dblog.engine.events import INSERT, Event
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.sources.base import RowChange, TxnEnd
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.store import EventStore
from airflow_provider_dblog.engine.tail import Tail

SCHEMA = TableSchema("db", "t", (Column("id", "int64", False), Column("v", "string")), ("id",))


class _Cycle:
    def __init__(self):
        self.me = self


class ScriptedSource:
    """A log of ``n`` one-row transactions; records the GC state as it is read, and
    leaves a reference cycle behind per transaction."""
    name, tables = "src", ("db.t",)

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.gc_seen: set[bool] = set()
        self.cycles: list[weakref.ref] = []

    def table_schema(self, table):
        return SCHEMA

    def describe_table(self, table):   # a schema version (engine/schema_history.py)
        return {"schema": SCHEMA.to_dict(), "native": [], "extra": {}}

    def adopt_table(self, table, version):
        return TableSchema.from_dict(version["schema"])

    def prepare_log(self):
        pass

    def current_resume(self):
        return Position(1, 4, 0), {"file": "x.000001", "pos": 4}

    def confirm(self, resume):
        pass

    def log_gap(self, resume):
        return None

    def is_transient(self, error):
        return False

    def read_log(self, resume, should_stop):
        for i in range(self.n):
            if should_stop():
                return
            if i == self.fail_at:
                raise RuntimeError("the log broke")
            self.gc_seen.add(gc.isenabled())
            c = _Cycle()
            self.cycles.append(weakref.ref(c))
            del c
            pos = Position(1, 100 + i, 0)
            yield RowChange(Event("db.t", INSERT, (i,), None, {"id": i, "v": str(i)}, pos, 0))
            yield TxnEnd(Position(1, 101 + i, 0), {"file": "x.000001", "pos": 101 + i})


@pytest.fixture
def parts(redis_client, redis_prefix, tmp_path):
    state = RedisState("", redis_prefix, "src", client=redis_client)
    return state, EventStore(str(tmp_path), "src")


@pytest.mark.parametrize("enabled_before", [True, False])
def test_gc_is_off_while_reading_and_restored_after(parts, enabled_before):
    state, store = parts
    src = ScriptedSource(50)
    (gc.enable if enabled_before else gc.disable)()
    try:
        stats = Tail(src, state, store, TailConfig(flush_events=10, flush_seconds=60)).run(max_events=50)
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
    assert src.gc_seen == {False}
    assert stats.events == 50 and stats.flushes == 5
    assert state.checkpoint().pos == Position(1, 150, 0)
    assert store.read_range(SCHEMA, None, Position(1, 150, 0)).num_rows == 50
    # the cycles made while the tail ran were collected at its flushes, not left for later
    assert sum(r() is not None for r in src.cycles[:40]) == 0


def test_gc_is_restored_when_the_log_fails(parts):
    state, store = parts
    gc.enable()
    with pytest.raises(RuntimeError, match="the log broke"):
        Tail(ScriptedSource(30, fail_at=15), state, store,
             TailConfig(flush_events=10, flush_seconds=60)).run(max_events=30)
    assert gc.isenabled()
    # what was flushed before the failure is committed; the rest is not
    assert state.checkpoint().pos == Position(1, 110, 0)
