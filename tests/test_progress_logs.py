"""What a running tail and dump say in the live log: the tail at a steady interval
(``tail.progress_seconds``: events so far, their rate, the lag, the checkpoint); each dump
chunk its rows, stale rows dropped, window time, and the requested keys the source lacks."""
from __future__ import annotations

import logging
import re

import pytest

from airflow_provider_dblog.engine.config import TailConfig, parse_config
from airflow_provider_dblog.engine.dump import MISSING_SHOWN, missing_note
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.store import EventStore
from airflow_provider_dblog.engine.tail import Tail

from test_tail_gc import ScriptedSource

LINE = re.compile(r"^tail src: (\d+) events, 0 watermarks so far; \d+ events/s over the last [\d.]+ s; "
                  r"lag [\d.]+ s; checkpoint (\S+)$")


@pytest.fixture
def parts(redis_client, redis_prefix, tmp_path):
    return RedisState("", redis_prefix, "src", client=redis_client), EventStore(str(tmp_path), "src")


def progress_lines(caplog) -> list[re.Match]:
    lines = [r.getMessage() for r in caplog.records if r.name == "airflow_provider_dblog.engine.tail"]
    return [m for m in map(LINE.match, lines) if m]


def test_progress_lines_count_what_is_committed(parts, caplog):
    state, store = parts
    caplog.set_level(logging.INFO, logger="airflow_provider_dblog.engine.tail")
    # any interval at all: a line at every step of the read loop
    Tail(ScriptedSource(50), state, store,
         TailConfig(flush_events=10, flush_seconds=60, progress_seconds=1e-9)).run(max_events=50)
    seen = progress_lines(caplog)
    assert len(seen) >= 5
    counts = [int(m.group(1)) for m in seen]
    assert counts == sorted(counts) and counts[-1] == 50 and set(counts) == {0, 10, 20, 30, 40, 50}
    for m in seen:   # each line's checkpoint is the one its events are committed through
        assert Position.decode(m.group(2)) == Position(1, 100 + int(m.group(1)), 0) or int(m.group(1)) == 0


def test_no_progress_lines_when_turned_off(parts, caplog):
    state, store = parts
    caplog.set_level(logging.INFO, logger="airflow_provider_dblog.engine.tail")
    Tail(ScriptedSource(20), state, store,
         TailConfig(flush_events=10, flush_seconds=60, progress_seconds=0)).run(max_events=20)
    assert progress_lines(caplog) == []


def test_the_interval_is_configured():
    cfg = parse_config({"sources": {"s": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["d.t"]}},
                        "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"},
                        "tail": {"progress_seconds": 10}}, env={})
    assert cfg.tail.progress_seconds == 10 and TailConfig().progress_seconds == 30.0


def test_missing_keys_are_listed_bounded():
    assert missing_note([]) == ""
    assert missing_note([(1001, "a"), (7, "b")]) == '; 2 requested key(s) not in the source: [1001, "a"], [7, "b"]'
    many = missing_note([(i,) for i in range(MISSING_SHOWN + 5)])
    assert many.startswith(f"; {MISSING_SHOWN + 5} requested key(s) not in the source: [0], [1], ")
    assert many.endswith(f"[{MISSING_SHOWN - 1}] and 5 more")
