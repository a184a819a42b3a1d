"""The next chunk of a dump, opened and selected while the one before it finishes.

``DumpRunner.run`` (dump.py) finishes chunk k (waits for its HW in the log, reconciles,
writes the snapshot, moves progress) on its own thread; meanwhile one worker thread plans
chunk k+1 from k's end (``ChunkPlanner.successor``), opens its window, writes its LW,
selects it and writes its HW: the same steps, in the same order, as a chunk taken one after
the other. Its window opens after k's HW is written, so the windows never overlap in the
log; k+1's finish starts only once k's has completed, so progress and snapshots still move
in chunk order (invariant 5). The request's flags, status and lease are read before k+1's
window opens, and again when it is taken: a pause or cancel set meanwhile gives it up and
is met by ``next_chunk_of``, as between any two chunks. The table's progress is read for
k+1's plan before k can complete (read after, a key list's slice would be skipped). A chunk
made ready and then not taken (k failed, the run stops, a flag) has its window closed and
its rows removed: the next run plans it again from progress.
No Spark and no Airflow here (the reader the runner holds may be Spark's).
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa

from .chunk_plan import ChunkPlanner
from .chunks import ChunkTask, fail_window
from .requests import request_or_raise
from .windows import Window

if TYPE_CHECKING:
    from .dump import DumpRunner

log = logging.getLogger(__name__)

Ready = tuple[ChunkTask, Window, pa.Table]   # a chunk selected, its HW written: to be finished


class ChunkAhead:
    """At most one chunk being made ready, on one worker thread."""

    def __init__(self, runner: "DumpRunner"):
        self.runner = runner
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def start(self, rid: str, task: ChunkTask, window: Window) -> None:
        """Begin making ready the chunk after ``task`` (whose ``window`` stays open)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dblog-dump-ahead")
        # read here, before ``task`` completes: read on the worker, it may already count
        # ``task``'s keys (its finish is not waited for), and the successor would skip a slice
        progress = self.runner.state.progress(rid, task.table)
        self._pending = self._pool.submit(self._prepare, rid, task, window, progress)

    def take(self) -> Ready | None:
        """The chunk made ready, or None (none was started, or none was due: a table's last
        chunk came before, or a flag is set). Raises what its preparation raised (its window
        was closed as failed then)."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def drop(self, why: str) -> None:
        """Give up the chunk being made ready (waited for): its window closed as failed
        (``why``), its rows removed; nothing else was written for it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            ready = pending.result()
        except BaseException:   # noqa: BLE001 - its own failure closed its window
            return
        if ready is not None:
            self.give_up(ready, why)

    def give_up(self, ready: Ready, why: str) -> None:
        """A chunk made ready and not taken: its window closed as failed, its rows removed."""
        task, window, _ = ready
        r = self.runner
        fail_window(r.state, window, why, "ahead", request_failed=False)
        r.store.remove_chunk(task.request, task.table, window.id)
        log.info("%s: the chunk selected ahead in window %s is given up (%s): it is planned again",
                 task.table, window.id, why)

    def stopping(self, rid: str) -> bool:
        """The request was paused or cancelled (or finished) since its chunk ahead was planned."""
        st = self.runner.state
        req = request_or_raise(st, rid)
        return req["status"] in ("done", "cancelled") or st.flag(rid, "cancel") or st.flag(rid, "pause")

    def close(self) -> None:
        self.drop("the dump run stopped")
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _prepare(self, rid: str, task: ChunkTask, before: Window, progress: dict) -> Ready | None:
        r = self.runner
        r._check_lease()
        if self.stopping(rid):
            return None
        nxt = ChunkPlanner(r.source, r.state).successor(rid, r.spec(rid), task, progress)
        if nxt is None:
            return None
        window, rows = r.open_and_select(nxt, keep=before.id)
        return nxt, window, rows
