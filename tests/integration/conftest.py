"""A whole CDC set-up per test: a fresh source database, target database, Redis
prefix and storage root, with the real tail, dump and apply around them."""
from __future__ import annotations

import threading
import time

import pytest
import yaml

from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.jobs import run_spark_job
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.store import EventStore
from airflow_provider_dblog.engine.tail import Tail
from airflow_provider_dblog.engine.targets import open_target, target_table_name
from airflow_provider_dblog.engine.verify import compare_source_target

from helpers import POSTGRES_PORT, REDIS_PORT, lake_target, unique
from sourcedb import KINDS


def _lake_target(kind: bool | str, tmp_path) -> dict:
    kind = "delta" if kind is True else kind
    return lake_target(kind, tmp_path / ("lake" if kind == "delta" else "warehouse"))


class CDC:
    def __init__(self, sdb, tables: list[str], tmp_path, redis_prefix: str, lake: bool | str = False,
                 **overrides):
        self.sdb = sdb
        self.db = sdb.name  # the namespace of the tables: f"{cdc.db}.t"
        self.wm_ns = unique("wm")
        raw = {
            "sources": {"src": sdb.source_config(tables, self.wm_ns,
                                                 5000 + int(time.time() * 1000) % 100000)},
            "targets": {"tgt": {"kind": "postgres", "source": "src", "host": "127.0.0.1",
                                "port": POSTGRES_PORT, "user": "postgres", "database": unique("tgt")},
                        # a lake target too (issue 28): lake=True or "delta", or "iceberg";
                        # "both": "lake" (Delta) and "ice" (Iceberg)
                        **({"lake": _lake_target("delta", tmp_path), "ice": _lake_target("iceberg", tmp_path)}
                           if lake == "both" else {"lake": _lake_target(lake, tmp_path)} if lake else {})},
            "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": redis_prefix},
            "storage": {"root": str(tmp_path / "storage")},
            "spark": {"master": "local[2]"},
            "dump": {"chunk_size": 20_000, "parallelism": 2, "window_timeout_s": 60},
            "tail": {"flush_events": 5_000, "flush_seconds": 0.2},
            "apply": {},
        }
        raw["sources"]["src"].update(overrides.pop("source", {}))
        for section, values in overrides.items():
            raw[section].update(values)
        self.path = tmp_path / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.cfg = load_config(self.path)
        self.src_cfg = self.cfg.source()
        self.state = RedisState(self.cfg.redis_url, self.cfg.state_prefix, "src")
        self.store = EventStore(self.cfg.storage_root, "src")
        self.source = open_source(self.src_cfg)
        self._tail_thread: threading.Thread | None = None
        self._tail_stop = threading.Event()
        self.tail_error: BaseException | None = None
        self.tail_stats = []

    # -- the tail, in a thread of the test process ----------------------------
    def start_tail(self) -> None:
        self._tail_stop.clear()

        def run():
            try:
                tail = Tail(open_source(self.src_cfg), self.state, self.store, self.cfg.tail,
                            dump=self.cfg.dump)
                self.tail_stats.append(tail.run(should_stop=self._tail_stop.is_set))
            except BaseException as e:  # surfaced by stop_tail
                self.tail_error = e
        self._tail_thread = threading.Thread(target=run, daemon=True)
        self._tail_thread.start()
        deadline = time.monotonic() + 30
        while self.state.checkpoint() is None:
            assert time.monotonic() < deadline, "the tail did not checkpoint its start"
            assert self.tail_error is None, self.tail_error
            time.sleep(0.05)

    def drain(self, timeout: float = 120) -> None:
        """Wait until the tail's checkpoint reaches the current end of the log."""
        head, _ = self.source.current_resume()
        deadline = time.monotonic() + timeout
        while not (self.state.checkpoint() and self.state.checkpoint().pos >= head):
            assert self.tail_error is None, self.tail_error
            assert time.monotonic() < deadline, f"tail did not reach {head}"
            time.sleep(0.05)

    def stop_tail(self) -> None:
        self._tail_stop.set()
        if self._tail_thread:
            self._tail_thread.join(60)
        if self.tail_error:
            raise self.tail_error

    # -- dump and apply --------------------------------------------------------
    def request(self, spec: DumpSpec) -> str:
        return DumpRunner(self.source, self.state, self.store, None, self.cfg.dump).submit(spec)

    def dump_local(self, table: str, rid: str | None = None) -> str:
        """A full dump of ``table`` (or request ``rid``) in this process, its chunks read by
        the in-process reader (the tail running closes its windows); done, then drained."""
        rid = rid or self.request(DumpSpec("table", [f"{self.db}.{table}"]))
        DumpRunner(self.source, self.state, self.store, LocalChunkReader(self.source), self.cfg.dump).run(rid)
        assert self.state.request(rid)["status"] == "done", self.state.request(rid)
        self.drain()
        return rid

    def dump_spark(self, rid: str, max_chunks: int | None = None) -> dict:
        args = ["--config", str(self.path), "--source", "src", "--request", rid]
        if max_chunks:
            args += ["--max-chunks", str(max_chunks)]
        return run_spark_job(self.cfg, "dump_job", args)

    def apply(self) -> dict:
        return self.apply_spark("tgt")

    def apply_spark(self, target: str) -> dict:
        return run_spark_job(self.cfg, "apply_job", ["--config", str(self.path), "--target", target])

    def target(self, name: str = "tgt"):
        return open_target(self.cfg.target(name))

    def compare(self, table: str, target: str = "tgt"):
        schema = self.source.table_schema(f"{self.db}.{table}")
        return compare_source_target(self.src_cfg, self.cfg.target(target), schema, target_table_name(schema))

    def apply_local(self, target: str = "tgt") -> dict:
        """An in-process apply of every table: {table: result}."""
        from airflow_provider_dblog.engine.apply import run_apply
        return run_apply(self.cfg, target, via="local")["tables"]

    def assert_equal(self, *tables: str, target: str = "tgt") -> None:
        """Each table equals its target row for row, in the shape the source has now."""
        for t in tables:
            self.source.refresh_schema(f"{self.db}.{t}")
            diff = self.compare(t, target)
            assert diff.equal, (t, diff.describe())

    def close(self) -> None:
        try:
            self.stop_tail()
        finally:
            for name in self.cfg.targets:
                with open_target(self.cfg.target(name)) as t:
                    t.drop_all()
            self.source.close()
            self.sdb.drop_namespace(self.wm_ns)


@pytest.fixture(params=sorted(KINDS))
def src_db(request, servers):
    """A fresh source namespace on each source kind in turn (tests/sourcedb.py).
    A test for one kind only: @pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)."""
    sdb = KINDS[request.param]()
    yield sdb
    sdb.close()


@pytest.fixture
def make_cdc(src_db, tmp_path, redis_prefix):
    made = []

    def make(tables: list[str], **overrides) -> CDC:
        c = CDC(src_db, tables, tmp_path, redis_prefix, **overrides)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
