"""The tail benchmark's physical limit (issue 30): the C decoder shipped with each database
(``mariadb-binlog -v --base64-output=DECODE-ROWS``; ``pg_recvlogical`` on pgoutput) over a
pre-written range of the real servers, set up as bench/phases.py ``tail`` does (the Env's
log prepared first, then the writes, then the head of the log as the stop).

It must count exactly the row changes written (its output is parsed: MariaDB's ``###``
lines, PostgreSQL's pgoutput messages decoded one by one) and report a positive rate;
a range that does not hold them is an error, not a figure."""
from __future__ import annotations

import uuid

import pytest

from bench.env import Env
from bench.phases import _prepare_log
from bench.sources import open_bench_source

N = 200


@pytest.fixture(params=["mysql", "postgres"])
def bench_src(request, servers):
    src = open_bench_source(request.param, "phys" + uuid.uuid4().hex[:8])
    src.setup()
    try:
        yield src
    finally:
        src.teardown()


def test_the_c_decoder_counts_exactly_the_written_changes(bench_src, tmp_path):
    src = bench_src
    src.create_table("tail_events")
    env = Env(src, "tail", ["tail_events"], tmp_path)
    try:
        _prepare_log(env)  # PostgreSQL: the Env's publication (and slot), as in the phase
        _, resume = src.write_events("tail_events", N, 10)
        end = src.log_end()
        if src.kind == "mysql":  # an empty range holds none of them: refused, not measured
            with pytest.raises(RuntimeError, match="decoded 0 row changes"):
                src.physical_read(resume, resume, N, ["tail_events"], env.wm)
        res = src.physical_read(resume, end, N, ["tail_events"], env.wm)
    finally:
        env.close(keep=False)
    assert res["events"] == N, res
    assert res["seconds"] > 0 and res["events_per_s"] > 0, res
    assert res["tool"] in ("mariadb-binlog", "mysqlbinlog", "pg_recvlogical"), res
    if src.kind == "postgres":  # its slots are gone; the bare loop's stays for bare_read
        slots = {r[0] for r in src._query("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                          (src.db,), db=None)}
        assert not slots & set(src.recv_slots), slots


def test_a_range_over_two_binlog_files_is_read_one_process_per_file(servers, tmp_path):
    """The start position applies to the first file and the stop position to the last:
    a rotation between the writes and the head loses and doubles nothing."""
    src = open_bench_source("mysql", "phys" + uuid.uuid4().hex[:8])
    src.setup()
    try:
        src.create_table("tail_events")
        _, resume = src.write_events("tail_events", N, 10)
        conn = src.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("FLUSH BINARY LOGS")
                cur.execute("UPDATE tail_events SET v = v + 1 WHERE id <= 7")
        finally:
            conn.close()
        end = src.log_end()
        res = src.physical_read(resume, end, N + 7, ["tail_events"], "unused_wm")
    finally:
        src.teardown()
    assert res["events"] == N + 7, res
    assert len(res["files"]) >= 2 and res["files"][0] == resume["file"] and res["files"][-1] == end["file"], res
