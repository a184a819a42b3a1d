"""The application: one connection writing at a steady rate, half inserts of new
rows and half updates of existing ones, each a single autocommit statement.

Each write carries a unique ``wseq`` so its event can be found in the changelog.
It runs in its own process so neither the harness nor the tail disturbs its timing.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from pathlib import Path

from .sources import BenchSource


def _write_loop(src: BenchSource, table: str, rate: float, first_new_id: int, max_old_id: int,
                stop, out: str) -> None:
    rng = random.Random(42)
    conn = src.connect()
    ins, upd = src.insert_sql(table), src.update_sql(table)
    rows = []  # (wseq, commit wall time, latency s, op)
    period, next_id, wseq = 1.0 / rate, first_new_id, 0
    due = time.monotonic()
    with conn.cursor() as cur:
        while not stop.is_set():
            wseq += 1
            insert = wseq % 2 == 1
            t0 = time.perf_counter()
            if insert:
                cur.execute(ins, (next_id, wseq))
                next_id += 1
            else:
                cur.execute(upd, (wseq, rng.randint(1, max_old_id)))
            lat = time.perf_counter() - t0
            # the statement returned: the commit is acknowledged now (wall clock,
            # comparable with the tail's checkpoint times on this machine)
            rows.append((wseq, time.time(), lat, "i" if insert else "u"))
            due = max(due + period, time.monotonic())  # open loop, no bursts after a stall
            time.sleep(max(0.0, due - time.monotonic()))
    conn.close()
    Path(out).write_text(json.dumps(rows))


class Writer:
    def __init__(self, src: BenchSource, table: str, rate: float, first_new_id: int, max_old_id: int,
                 out: Path):
        ctx = mp.get_context("fork")
        self.stop_ev, self.out = ctx.Event(), out
        self.proc = ctx.Process(target=_write_loop, daemon=True,
                                args=(src, table, rate, first_new_id, max_old_id, self.stop_ev, str(out)))

    def start(self) -> "Writer":
        self.proc.start()
        return self

    def finish(self) -> list[tuple]:
        self.stop_ev.set()
        self.proc.join(60)
        return [tuple(r) for r in json.loads(self.out.read_text())]
