"""A dump request's controls (engine/requests.py), against the private Redis: the one set of
rules the dblog command, the control operator and the chunk tasks apply."""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.errors import ConfigError, DumpCancelledError
from airflow_provider_dblog.engine.requests import (UnknownRequestError, control_request,
                                                    controllable_requests, runnable_request)
from airflow_provider_dblog.engine.state import RedisState
from helpers import REDIS_PORT


@pytest.fixture
def state(redis_prefix):
    return RedisState(f"redis://127.0.0.1:{REDIS_PORT}/0", redis_prefix, "src")


def new_request(state: RedisState, status: str | None = None) -> str:
    rid = state.create_request({"scope": "table", "tables": ["db.t"], "keys": []})
    if status:
        state.set_request_status(rid, status)
    return rid


def test_pause_resume_cancel_of_a_running_request(state):
    rid = new_request(state, "running")
    assert control_request(state, rid, "pause") == {"request": rid, "action": "pause", "status": "running",
                                                    "pause": True, "cancel": False}
    assert control_request(state, rid, "resume")["pause"] is False
    out = control_request(state, rid, "cancel")
    assert out["cancel"] is True and state.flag(rid, "cancel")
    with pytest.raises(DumpCancelledError, match="cancelled"):
        runnable_request(state, rid)


@pytest.mark.parametrize("status, action, words", [
    ("done", "pause", "is done: there is nothing to pause"),
    ("done", "cancel", "is done: there is nothing to cancel"),
    ("cancelled", "pause", "is cancelled: there is nothing to pause"),
    ("cancelled", "cancel", "is cancelled: there is nothing to cancel"),
    ("cancelled", "resume", "cannot be resumed"),
])
def test_a_finished_request_refuses_with_a_message_and_nothing_changes(state, status, action, words):
    rid = new_request(state, status)
    with pytest.raises(ConfigError, match=words):
        control_request(state, rid, action)
    assert not state.flag(rid, "pause") and not state.flag(rid, "cancel")
    assert state.request(rid)["status"] == status


def test_a_done_request_may_be_resumed_and_run_again(state):
    """Its run finds nothing left; resuming changes no flag a run would stop on."""
    rid = new_request(state, "done")
    assert control_request(state, rid, "resume")["pause"] is False
    assert runnable_request(state, rid)["status"] == "done"


def test_unknown_requests_and_actions(state):
    with pytest.raises(UnknownRequestError, match="unknown dump request 'nope' on source 'src'"):
        control_request(state, "nope", "pause")
    with pytest.raises(UnknownRequestError):
        runnable_request(state, "")
    rid = new_request(state)
    with pytest.raises(ConfigError, match="action must be one of"):
        control_request(state, rid, "stop")


def test_the_requests_that_pause_resume_or_cancel_still_apply_to(state):
    running, paused, done, cancelled = (new_request(state, s) for s in ("running", "paused", "done", "cancelled"))
    flagged = new_request(state, "running")
    control_request(state, flagged, "cancel")  # cancel flag set; the run has not stopped yet
    choices = controllable_requests(state)
    assert list(choices) == [paused, running], choices  # newest first
    assert choices[paused] == f"{paused} — paused, table of db.t"
