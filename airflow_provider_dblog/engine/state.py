"""Redis state: tail checkpoint, watermarks seen, windows, dump requests, leases.

Keys live under ``<prefix>:<source>:``. Everything the tail acknowledges goes
through one fenced Lua script, so a tail that lost its lease cannot move the
checkpoint, and the checkpoint and the watermarks it covers move together.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from .errors import ChunkInFlightError, LeaseLostError, WatermarkError, WindowTimeoutError
from .leases import Leases
from .positions import Position
from .windows import Window, WindowLook, state_key, window_look, window_look_commands

# KEYS: lease, checkpoint, watermarks, conflicts, counters, issued, samples
# ARGV: token, pos, resume, now, n_events, then uuid/pos pairs
# A watermark nobody issued (an earlier run's, or a closed window's) is drained:
# counted, never recorded, so it can never close a window by mistake.
_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local bad = 0
for i = 6, #ARGV, 2 do
  local seen = redis.call('HGET', KEYS[3], ARGV[i])
  if redis.call('HEXISTS', KEYS[6], ARGV[i]) == 0 then
    redis.call('HINCRBY', KEYS[5], 'stale_watermarks_drained', 1)
  elseif seen and seen ~= ARGV[i+1] then
    redis.call('HSET', KEYS[4], ARGV[i], seen .. ' ' .. ARGV[i+1])
    bad = bad + 1
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i+1])
  end
end
redis.call('HSET', KEYS[2], 'pos', ARGV[2], 'resume', ARGV[3], 'updated_at', ARGV[4])
redis.call('ZADD', KEYS[7], 0, ARGV[2] .. '|' .. ARGV[4])
redis.call('ZREMRANGEBYRANK', KEYS[7], 0, -10001)
redis.call('HINCRBY', KEYS[5], 'events_tailed', ARGV[5])
redis.call('HINCRBY', KEYS[5], 'flushes', 1)
return bad
"""

@dataclass
class Checkpoint:
    pos: Position
    resume: dict  # source-specific: where the log reader restarts
    updated_at: float = 0.0


class RedisState(Leases):
    def __init__(self, url: str, prefix: str, source: str, client: redis.Redis | None = None):
        self.r = client or redis.Redis.from_url(url, decode_responses=True)
        self.p = state_key(prefix, source)
        self.source = source
        self._commit = self.r.register_script(_COMMIT)
        self._register_lease_scripts()

    def k(self, *parts: str) -> str:
        return ":".join((self.p, *parts))

    # -- the tail's checkpoint and watermarks (leases: engine/leases.py) ---------
    def captured_at(self, pos: Position) -> float | None:
        """The latest time the tail's checkpoint was at or below ``pos``: every change the
        tail had captured by then lies below ``pos``. From the samples each commit records
        (the last 10,000), so a target applied up to ``pos`` lags by at most now minus this."""
        found = self.r.zrevrangebylex(self.k("checkpoint_samples"), f"[{pos.encode()}|~", "-", start=0, num=1)
        return float(found[0].split("|", 1)[1]) if found else None

    def checkpoint(self) -> Checkpoint | None:
        d = self.r.hgetall(self.k("checkpoint"))
        if not d:
            return None
        return Checkpoint(Position.decode(d["pos"]), json.loads(d["resume"]), float(d["updated_at"]))

    def commit(self, token: str, pos: Position, resume: dict, watermarks: list[tuple[str, Position]],
               n_events: int) -> int:
        """Acknowledge everything before ``pos`` (already durable in the store)."""
        args: list[Any] = [token, pos.encode(), json.dumps(resume), repr(time.time()), n_events]
        for wm, wpos in watermarks:
            args += [wm, wpos.encode()]
        keys = [self.k("lease"), self.k("checkpoint"), self.k("watermarks"),
                self.k("watermark_conflicts"), self.k("counters"), self.k("issued"),
                self.k("checkpoint_samples")]
        res = self._commit(keys=keys, args=args)
        if res == -1:
            raise LeaseLostError(f"tail lease {token} lost: checkpoint not moved")
        # a watermark seen at two positions is recorded, and fails the window that
        # owns it (wait_window); the tail itself never stops for it
        return int(res)

    def watermark_pos(self, wm: str) -> Position | None:
        v = self.r.hget(self.k("watermarks"), wm)
        return Position.decode(v) if v else None

    def record_issued(self, wm: str, info: dict) -> None:
        """Which request and table a watermark UUID belongs to (written before the UUID is)."""
        self.r.hset(self.k("issued"), wm, json.dumps(info | {"at": time.time()}))

    def issued(self, wm: str) -> dict | None:
        v = self.r.hget(self.k("issued"), wm)
        return json.loads(v) if v else None

    # -- windows and the apply frontier --------------------------------------
    def open_window(self, request: str, table: str, floor: Position) -> Window:
        w = Window(uuid.uuid4().hex, request, table, str(uuid.uuid4()), str(uuid.uuid4()), floor)
        pipe = self.r.pipeline(transaction=True)
        self._add_window(pipe, w)
        pipe.execute()
        return w

    def _add_window(self, pipe, w: Window) -> None:
        """The window, and its watermarks as issued (so the tail records them when seen)."""
        pipe.hset(self.k("windows"), w.id, w.to_json())
        for kind, wm in (("lw", w.lw), ("hw", w.hw)):
            pipe.hset(self.k("issued"), wm, json.dumps(
                {"request": w.request, "table": w.table, "window": w.id, "kind": kind, "at": w.opened_at}))

    def open_windows(self) -> list[Window]:
        return [Window.from_json(v) for v in self.r.hvals(self.k("windows"))]

    def close_window(self, window: Window, outcome: str, detail: dict | None = None) -> None:
        pipe = self.r.pipeline(transaction=True)
        self._forget_window(pipe, window)
        pipe.lpush(self.k("windows_closed"), json.dumps(
            {"id": window.id, "request": window.request, "table": window.table,
             "outcome": outcome, "at": time.time()} | (detail or {})))
        pipe.ltrim(self.k("windows_closed"), 0, 9999)
        pipe.execute()

    def _forget_window(self, pipe, window: Window) -> None:
        pipe.hdel(self.k("windows"), window.id)
        pipe.hdel(self.k("watermarks"), window.lw, window.hw)
        pipe.hdel(self.k("issued"), window.lw, window.hw)

    def frontier(self) -> Position | None:
        """Events below this position are final: no snapshot can still land under it."""
        cp = self.checkpoint()
        if cp is None:
            return None
        floors = [w.floor for w in self.open_windows()]
        return min([cp.pos, *floors])

    def window_is_open(self, window_id: str) -> bool:
        return bool(self.r.hexists(self.k("windows"), window_id))

    def look_window(self, window: Window) -> WindowLook:
        """One look at the window (one round trip): its watermarks, open or not, the checkpoint."""
        with self.r.pipeline(transaction=False) as pipe:
            window_look_commands(pipe, self.k, window)
            return window_look(window, pipe.execute())

    def poll_window(self, window: Window) -> tuple[Position, Position] | None:
        """``(lw, hw)`` once durable through the HW, else None. Raises WatermarkError as
        ``check_window_positions`` does."""
        return self.look_window(window).positions()

    def wait_window(self, window: Window, timeout_s: float, poll_s: float = 0.05) -> tuple[Position, Position]:
        """Block until the tail made the log durable through the window's HW."""
        deadline = time.monotonic() + timeout_s
        while True:
            look = self.look_window(window)
            seen = look.positions()
            if seen is not None:
                return seen
            if not look.is_open:
                raise WatermarkError(look.closed_message())
            if time.monotonic() > deadline:
                raise WindowTimeoutError(look.timeout_message(timeout_s))
            time.sleep(poll_s)

    def open_exclusive_window(self, request: str, table: str, floor: Position, abandon_after_s: float,
                              keep: str | None = None) -> tuple[Window, list[Window]]:
        """Open a window for the request's next chunk when no other chunk of it is in flight
        (but window ``keep``: the chunk before it, finishing meanwhile, engine/dump_ahead.py).

        Windows of the same request opened less than ``abandon_after_s`` ago are a chunk in
        flight: ChunkInFlightError, nothing changed. Older ones were left by a crashed run:
        closed as abandoned in the same transaction as the new window opens (their late
        finish, if any, cannot move progress: ``complete_chunk`` refuses a closed window).
        Returns the new window and the abandoned ones.
        """
        key = self.k("windows")
        while True:
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    mine = [w for w in (Window.from_json(v) for v in pipe.hvals(key))
                            if w.request == request and w.id != keep]
                    now = time.time()
                    young = [w for w in mine if now - w.opened_at < abandon_after_s]
                    if young:
                        w = young[0]
                        raise ChunkInFlightError(
                            f"a chunk of request {request} is in flight: window {w.id} of {w.table} opened "
                            f"{now - w.opened_at:.0f}s ago. A request runs one chunk at a time; it is taken "
                            f"to be left by a crashed run after {abandon_after_s:.0f}s")
                    window = Window(uuid.uuid4().hex, request, table, str(uuid.uuid4()), str(uuid.uuid4()), floor)
                    pipe.multi()
                    for w in mine:
                        self._forget_window(pipe, w)
                        pipe.lpush(self.k("windows_closed"), json.dumps(
                            {"id": w.id, "request": w.request, "table": w.table, "outcome": "abandoned",
                             "at": now, "replaced_by": window.id}))
                    pipe.ltrim(self.k("windows_closed"), 0, 9999)
                    self._add_window(pipe, window)
                    pipe.execute()
                    return window, mine
                except redis.WatchError:
                    continue

    def close_abandoned_windows(self, abandon_after_s: float) -> list[Window]:
        """Close the windows whose runner is gone: opened more than ``abandon_after_s`` ago
        and their request's lease held by no runner. Each is closed as abandoned (the apply
        frontier no longer waits for it) and its request marked ``interrupted``: its chunk
        progress never moved, so resuming the request redoes that chunk. Returns them."""
        closed = []
        for w in self.open_windows():
            age = time.time() - w.opened_at
            if age < abandon_after_s:
                continue
            req_key, lease_key = self.k("request", w.request), self._lease_keys(w.request)[0]
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.k("windows"), lease_key, req_key)
                    if not pipe.hexists(self.k("windows"), w.id) or pipe.exists(lease_key):
                        continue
                    status = pipe.hget(req_key, "status")
                    reason = (f"window {w.id} of {w.table} open for {age:.0f}s (abandon_after_s "
                              f"{abandon_after_s:.0f}) with no runner holding the request: closed as "
                              "abandoned; resume the request to redo its chunk")
                    pipe.multi()
                    self._forget_window(pipe, w)
                    pipe.lpush(self.k("windows_closed"), json.dumps(
                        {"id": w.id, "request": w.request, "table": w.table, "outcome": "abandoned",
                         "at": time.time(), "age_s": round(age, 1), "reason": "no runner"}))
                    pipe.ltrim(self.k("windows_closed"), 0, 9999)
                    if status is not None and status not in ("done", "cancelled", "failed"):
                        pipe.hset(req_key, mapping={"status": "interrupted", "error": reason,
                                                    "updated_at": time.time()})
                    pipe.hincrby(self.k("counters"), "windows_abandoned", 1)
                    pipe.execute()
                    closed.append(w)
                except redis.WatchError:
                    continue  # it changed meanwhile (finished, or a runner came): look again next time
        return closed

    def closed_windows(self, limit: int = 20) -> list[dict]:
        """The last windows closed, newest first (outcome done, failed, cancelled, abandoned)."""
        return [json.loads(v) for v in self.r.lrange(self.k("windows_closed"), 0, limit - 1)]

    # -- dump requests ---------------------------------------------------------
    def create_request(self, spec: dict) -> str:
        rid = spec.get("id") or time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        self.r.hset(self.k("request", rid), mapping={
            "spec": json.dumps(spec | {"id": rid}), "status": "pending", "created_at": time.time()})
        self.r.zadd(self.k("requests"), {rid: time.time()})
        return rid

    def request(self, rid: str) -> dict | None:
        d = self.r.hgetall(self.k("request", rid))
        if not d:
            return None
        d["spec"] = json.loads(d["spec"])
        return d

    def requests(self, limit: int = 20) -> list[str]:
        return list(self.r.zrevrange(self.k("requests"), 0, limit - 1))

    def set_request_status(self, rid: str, status: str, error: str = "") -> None:
        self.r.hset(self.k("request", rid), mapping={"status": status, "error": error,
                                                     "updated_at": time.time()})

    def set_flag(self, rid: str, flag: str, on: bool = True) -> None:
        if flag not in ("pause", "cancel"):
            raise ValueError(flag)
        self.r.hset(self.k("request", rid), f"flag_{flag}", "1" if on else "0")

    def flag(self, rid: str, flag: str) -> bool:
        return self.r.hget(self.k("request", rid), f"flag_{flag}") == "1"

    def progress(self, rid: str, table: str) -> dict:
        v = self.r.hget(self.k("request", rid), f"progress:{table}")
        return json.loads(v) if v else {}

    def save_progress(self, rid: str, table: str, progress: dict) -> None:
        self.r.hset(self.k("request", rid), f"progress:{table}", json.dumps(progress))

    def complete_chunk(self, rid: str, table: str, progress: dict, window: Window, detail: dict,
                       sweep: dict | None = None, lease_token: str | None = None) -> None:
        """Chunk progress moves with the window's close, after the snapshot is durable.

        Only while the window is still open: a window closed meanwhile (abandoned by a
        newer run of the request, or failed) raises WatermarkError and moves nothing, so
        its chunk is redone and never counted twice. ``sweep``: the table's orphan sweep,
        registered with its last chunk (``engine/sweep.py``). ``lease_token``: the runner's
        request lease (fencing): if another token holds it, or none does, LeaseLostError and
        nothing moves."""
        key = self.k("windows")
        lease_key = self._lease_keys(rid)[0]
        while True:
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key, self.k("sweeps"), lease_key)
                    if lease_token is not None and (held := pipe.get(lease_key)) != lease_token:
                        raise LeaseLostError(
                            f"the lease of dump request {rid} is {'held by ' + held if held else 'gone'}, not "
                            f"{lease_token}'s: this runner lost it (stalled past its TTL?); chunk progress "
                            "not moved, the request's current runner redoes the chunk")
                    if not pipe.hexists(key, window.id):
                        raise WatermarkError(
                            f"window {window.id} of {table} was closed before its chunk completed "
                            "(abandoned by a newer run of the request, or failed): progress not moved, "
                            "the chunk is redone")
                    if sweep is not None and (old := pipe.hget(self.k("sweeps"), table)) is not None \
                            and json.loads(old)["below"] >= sweep["below"]:
                        sweep = None  # a newer dump's sweep is there: it covers this one
                    pipe.multi()
                    pipe.hset(self.k("request", rid), f"progress:{table}", json.dumps(progress))
                    if sweep is not None:
                        self._put_sweep(pipe, sweep)
                    self._forget_window(pipe, window)
                    pipe.lpush(self.k("windows_closed"), json.dumps(
                        {"id": window.id, "request": rid, "table": table, "outcome": "done",
                         "at": time.time()} | detail))
                    pipe.ltrim(self.k("windows_closed"), 0, 9999)
                    pipe.hincrby(self.k("counters"), "chunks", 1)
                    pipe.hincrby(self.k("counters"), "snapshot_rows", detail.get("rows", 0))
                    pipe.hincrby(self.k("counters"), "stale_rows_dropped", detail.get("dropped", 0))
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    # -- orphan sweeps of full-table dumps (engine/sweep.py) ----------------------
    # one per table, the newest dump's (it deletes everything an older one would);
    # ``sweeps_done`` says, per table and target, which one that target has run
    def _put_sweep(self, pipe, sweep: dict) -> None:
        pipe.hset(self.k("sweeps"), sweep["table"], json.dumps(sweep))

    def add_sweep(self, sweep: dict) -> None:
        """Register a table's sweep unless a newer dump's is there already."""
        old = self.sweep(sweep["table"])
        if old is None or old["below"] < sweep["below"]:
            self._put_sweep(self.r, sweep)

    def sweep(self, table: str) -> dict | None:
        v = self.r.hget(self.k("sweeps"), table)
        return json.loads(v) if v else None

    def pending_sweep(self, table: str, target: str) -> dict | None:
        """The table's sweep if ``target`` has not run it yet."""
        sweep = self.sweep(table)
        if sweep is None:
            return None
        return _pending(sweep, self.r.hget(self.k("sweeps_done"), f"{table}|{target}"))

    def pending_sweeps(self, target: str) -> set[str]:
        """The tables with a sweep ``target`` has not run yet (two reads for all tables)."""
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.k("sweeps"))
            pipe.hgetall(self.k("sweeps_done"))
            sweeps, done = pipe.execute()
        return {t for t, v in sweeps.items() if _pending(json.loads(v), done.get(f"{t}|{target}"))}

    def sweeps_done(self, table: str) -> dict[str, dict]:
        """Per target, the last sweep of ``table`` it ran."""
        return {f.split("|", 1)[1]: json.loads(v) for f, v in self.r.hgetall(self.k("sweeps_done")).items()
                if f.split("|", 1)[0] == table}

    def finish_sweep(self, sweep: dict, target: str, deleted: int) -> None:
        """``target`` ran it: record that, and the count in the request."""
        rid, table = sweep["request"], sweep["table"]
        record = {"below": sweep["below"], "request": rid, "orphans_deleted": deleted, "at": time.time()}
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hset(self.k("sweeps_done"), f"{table}|{target}", json.dumps(record))
            pipe.hset(self.k("request", rid), f"swept:{table}:{target}", json.dumps(record))
            pipe.execute()

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.k("counters")).items()}

    def incr(self, name: str, by: int = 1) -> None:
        self.r.hincrby(self.k("counters"), name, by)

    def reset(self) -> None:
        """Drop every key of this source (tests and demo resets)."""
        keys = list(self.r.scan_iter(match=f"{self.p}:*", count=1000))
        if keys:
            self.r.delete(*keys)


def _pending(sweep: dict, done: str | None) -> dict | None:
    """``sweep`` unless the target's record of the sweep it ran (``done``) is as late."""
    return None if done and json.loads(done)["below"] >= sweep["below"] else sweep
