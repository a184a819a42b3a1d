"""A zombie tail (issue 15): a tail paused past its lease (a GC pause, SIGSTOP, a stalled
disk) while it holds a batch, continued after another tail took over from the same
checkpoint. Its late segment file must change no target.

The zombie, a real `dblog tail` process (tests/crashing.py), renews its lease, starts its
first segment write and stops itself there (SIGSTOP): the one place no lease check can
cover. Its lease expires; rows change; a new tail takes over from the same checkpoint and
flushes a longer first segment. Then the zombie goes on (SIGCONT): it writes its shorter
file for that same checkpoint, and fails at its fenced checkpoint commit. Before writer
names in segment files the zombie's file replaced the new tail's, and the rows the new
tail had read after the zombie's were gone from the store, and from the target.

Paused later, once its file's temporary copy is written (``after_tmp``), the zombie finds
that copy swept by the new tail's start: it says it lost its lease (it used to die with
a FileNotFoundError traceback) and writes nothing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.config import TailConfig
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.store import log_segment_name
from airflow_provider_dblog.engine.tail import Tail
from helpers import CRASHING, wait_until

LEASE_S = 2


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("after_tmp", [False, True], ids=["paused-before-its-file", "paused-before-its-rename"])
def test_a_zombie_tails_late_segment_changes_no_target(src_db, make_cdc, tmp_path, after_tmp):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
    cdc = make_cdc(["t"], tail={"lease_seconds": LEASE_S})
    cdc.source.ensure_watermark_table()  # (its first row is a write to the log: before the checkpoint)
    Tail(open_source(cdc.src_cfg), cdc.state, cdc.store, cdc.cfg.tail).run(max_events=0)  # the checkpoint: now
    start = cdc.state.checkpoint().pos
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (10, 10)")   # A: the zombie's batch

    # the zombie flushes at every transaction: its first flush holds A alone
    raw = yaml.safe_load(cdc.path.read_text())
    raw["tail"].update(flush_events=1)
    (zombie_cfg := tmp_path / "zombie.yaml").write_text(yaml.safe_dump(raw))
    marker = tmp_path / "paused-at"
    zombie = subprocess.Popen([sys.executable, str(CRASHING), "tail", "--config", str(zombie_cfg),
                               "--marker", str(marker), "--pause-at-write", "1"] + ["--after-tmp"] * after_tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: zombie.poll() is None and marker.exists() and _stopped(zombie.pid), 60,
                   "the zombie tail pausing in its first segment write")
        assert marker.read_text() == start.encode()
        zombie_token = cdc.state.lease_holder()
        with src_db.cursor() as cur:                   # while it sleeps: B, C, and A changed
            cur.execute("INSERT INTO t VALUES (11, 11)")
            cur.execute("INSERT INTO t VALUES (12, 12)")
            cur.execute("UPDATE t SET v = 100 WHERE id = 10")

        # the new tail waits out the zombie's lease, and flushes A, B, C, A' in its first segment
        config = TailConfig(**{**vars(cdc.cfg.tail), "flush_seconds": 3600.0})
        stats = Tail(open_source(cdc.src_cfg), cdc.state, cdc.store, config).run(max_events=4, wait_lease=60)
        assert not stats.skipped and stats.events == 4 and stats.flushes == 1, stats
        (taken_over,) = Path(cdc.store.table_dir(f"{cdc.db}.t")).glob(f"log-{start.encode()}.*")
        assert stats.start == start.encode() and cdc.state.checkpoint().pos > start
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
    _, err = zombie.communicate(timeout=60)
    err = err.decode()
    table_dir = Path(cdc.store.table_dir(f"{cdc.db}.t"))
    zombie_file = table_dir / log_segment_name(start, zombie_token.rsplit("|", 1)[1])
    files = sorted(p.name for p in table_dir.iterdir())
    if after_tmp:   # its half-written file swept, it stopped at its rename, with the clear error
        assert zombie.returncode == 2 and "lost" in err and "Traceback" not in err, (zombie.returncode, err[-3000:])
        assert not zombie_file.exists() and not any(".tmp-" in f for f in files), files
    else:   # it failed at its fenced commit (after its write), with the command's clear error
        assert zombie.returncode == 2 and "checkpoint not moved" in err and "Traceback" not in err, \
            (zombie.returncode, err[-3000:])
        assert zombie_file.exists(), files   # the zombie did write its late file, next to the new tail's
    assert taken_over.exists() and taken_over != zombie_file
    assert cdc.state.checkpoint().pos > start   # its commit moved nothing

    run_apply(cdc.cfg, "tgt", via="local")
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()
    assert Position.decode(stats.end) == cdc.state.checkpoint().pos
