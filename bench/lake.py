"""Lake-table targets (issue 28): the apply's merge against a plain append, merge cost
against table size, and file counts before and after maintenance.

    python -m bench.lake --out /tmp/lake [--kinds delta] [--big-rows 10000000]

No source database and no Spark: batches as the apply hands them to a target (the latest
event per key, flattened, with ``_dblog_pos`` / ``_dblog_op``) go straight into the
target's ``merge_batch``, so what is measured is the target. Per kind:

* ``apply``: rows/s of ``merge_batch`` (the one MERGE per batch, position guard, applied
  position in the commit) against a plain append of the same rows into a fresh table
  (``write_deltalake(mode="append")``), same run: inserts only (a dump's snapshot rows);
  half updates of keys among the newest ``--hot`` (the log of an OLTP table); half updates
  of keys anywhere in the table (copy-on-write's worst case: every file rewritten each
  batch). Goal >= 0.5. For the updates, also the library's own upsert of the same batches
  (delta-rs's bare MERGE, PyIceberg's ``Table.upsert``): ``vs_upsert`` > 1 is faster.
* ``size``: a batch of ``--batch`` rows (60% updates and 10% deletes of keys among the
  newest ``--hot`` keys, 30% new keys) merged into a ``--small-rows`` table and into a
  ``--big-rows`` table (built by big appends), the median of ``--repeat`` merges each,
  the two sizes alternating;
  goal: big/small <= 2. For context, once each: the same batch merged the way it was
  before pruning (a bare ``t.k = s.k`` MERGE over a stream), and a batch whose keys are
  spread uniformly over the whole table (every file touched: copy-on-write's worst case).
* ``files``: the file count of a table after ``--applies`` small applies of new keys
  (each MERGE that matches no file writes one small file), then after
  ``maintain`` (compaction, vacuum at the default retention), rows and applied position
  checked unchanged.

Writes ``lake.json`` under ``--out``. Kinds (:data:`KINDS`): ``delta`` and ``iceberg`` (its
catalog in the private PostgreSQL, ``make bootstrap``; baseline ``Table.append``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from airflow_provider_dblog.engine.config import TargetConfig
from airflow_provider_dblog.engine.events import DELETE, INSERT, UPDATE
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets.base import OP_COLUMN, POS_COLUMN

log = logging.getLogger("bench.lake")
SCHEMA = TableSchema("bench", "orders", (Column("id", "int64", False), Column("qty", "int32"),
                                         Column("price", "decimal(12,2)"), Column("status", "string"),
                                         Column("updated", "timestamp")), ("id",))
SOURCE = "bench"


def rows(ids: np.ndarray, pos: list[str] | str, op: str | list[str], seed: int) -> pa.Table:
    """Flattened batch rows for ``ids`` (narrow: a bigint key and four small columns)."""
    rng, n = np.random.default_rng(seed), len(ids)
    cents = rng.integers(0, 10**9, n)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "qty": pa.array(rng.integers(0, 1000, n), pa.int32()),
        "price": pa.array(cents, pa.int64()).cast(pa.decimal128(19, 0)).cast(pa.decimal128(12, 2)),
        "status": pa.array(np.array(["new", "paid", "sent", "done"])[rng.integers(0, 4, n)]),
        "updated": pa.array(1_700_000_000_000_000 + rng.integers(0, 10**12, n), pa.timestamp("us")),
        POS_COLUMN: pa.array([pos] * n if isinstance(pos, str) else pos, pa.string()),
        OP_COLUMN: pa.array([op] * n if isinstance(op, str) else op, pa.string()),
    })


def positions(log_no: int, n: int) -> list[str]:
    return [Position(log_no, 0, i).encode() for i in range(n)]


class DeltaKind:
    """The Delta target (targets/delta.py) and its baseline, ``write_deltalake``."""
    name = "delta"

    def __init__(self, root: Path):
        from airflow_provider_dblog.engine.targets.delta import DeltaTarget
        self.root = root
        self.make = lambda sub: DeltaTarget(TargetConfig(name="lake", kind="delta", endpoint=None, source=SOURCE,
                                                         path=str(root / sub)))

    def target(self, sub: str):
        t = self.make(sub)
        t.ensure_table(SCHEMA)
        return t

    def plain_append(self, sub: str, batches: list[pa.Table]) -> None:
        from deltalake import write_deltalake
        for b in batches:
            write_deltalake(str(self.root / sub), b, mode="append")

    def build(self, target, total: int, step: int = 1_000_000) -> None:
        """``total`` rows (ids 0..total-1) appended in big writes, then the applied position
        moved past them, as a dump's snapshot would leave the table."""
        from deltalake import DeltaTable, write_deltalake
        pos = Position(1, 0, 0).encode()
        for start in range(0, total, step):
            write_deltalake(DeltaTable(target.table_path(SCHEMA)),
                            rows(np.arange(start, min(total, start + step)), pos, INSERT, start), mode="append")
        target.advance_applied(SOURCE, SCHEMA, Position(1, 1, 0))

    def library_upsert(self, sub: str, batches: list[pa.Table]) -> float:
        """delta-rs's own upsert of the same batches (a bare MERGE: update all / insert all,
        no position guard, no deletes): what a user would write without this target."""
        from deltalake import DeltaTable, write_deltalake
        path = str(self.root / sub)
        write_deltalake(path, batches[0].slice(0, 0), mode="append")
        t0 = time.monotonic()
        for b in batches:
            (DeltaTable(path).merge(b, predicate="t.id = s.id", source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        return time.monotonic() - t0

    def files(self, target) -> int:
        from deltalake import DeltaTable
        return len(DeltaTable(target.table_path(SCHEMA)).file_uris())

    def last_merge(self, target) -> dict:
        from deltalake import DeltaTable
        m = DeltaTable(target.table_path(SCHEMA)).history(1)[0].get("operationMetrics", {})
        return {k: m.get(k) for k in ("num_target_files_scanned", "num_target_files_skipped_during_scan",
                                      "num_target_files_removed", "num_target_rows_copied")}

    def unpruned_merge(self, target, batch: pa.Table) -> float:
        """The MERGE as it was before pruning: only ``t.id = s.id``, the rows streamed."""
        from deltalake import DeltaTable
        t0 = time.monotonic()
        (DeltaTable(target.table_path(SCHEMA))
         .merge(pa.RecordBatchReader.from_batches(batch.schema, batch.to_batches()), predicate="t.id = s.id",
                source_alias="s", target_alias="t")
         .when_matched_delete(predicate=f"s.{OP_COLUMN} = '{DELETE}' AND s.{POS_COLUMN} > t.{POS_COLUMN}")
         .when_matched_update_all(predicate=f"s.{OP_COLUMN} != '{DELETE}' AND s.{POS_COLUMN} > t.{POS_COLUMN}")
         .when_not_matched_insert_all(predicate=f"s.{OP_COLUMN} != '{DELETE}'").execute())
        return time.monotonic() - t0


class IcebergKind:
    """The Iceberg target (targets/iceberg.py; its SQL catalog in a fresh database of the
    private PostgreSQL) and its baseline, PyIceberg's ``Table.append``."""
    name = "iceberg"

    def __init__(self, root: Path):
        from airflow_provider_dblog.engine.config import Endpoint
        from airflow_provider_dblog.engine.targets.iceberg import IcebergTarget
        self.root = root
        port = int(os.environ.get("DBLOG_BENCH_PG_PORT", "15432"))
        self.endpoint = Endpoint("127.0.0.1", port, "postgres", "", f"bench_lake_{int(time.time())}")
        self.make = lambda sub: IcebergTarget(TargetConfig(name="ice", kind="iceberg", endpoint=self.endpoint,
                                                           source=SOURCE, schema=sub.replace("-", "_"),
                                                           path=str(root)))

    def target(self, sub: str):
        t = self.make(sub)
        t.ensure_table(SCHEMA)
        return t

    def plain_append(self, sub: str, batches: list[pa.Table]) -> None:
        catalog = self.make("plain").catalog
        table = catalog.create_table(("plain", sub.replace("-", "_")), schema=batches[0].schema)
        for b in batches:
            table.append(b)

    def build(self, target, total: int, step: int = 1_000_000) -> None:
        """As DeltaKind.build: big appends (sorted by key), then the position past them."""
        t = target._load(SCHEMA)
        pos = Position(1, 0, 0).encode()
        for start in range(0, total, step):
            data = rows(np.arange(start, min(total, start + step)), pos, INSERT, start)
            t.append(data.cast(target._file_schema(t)))   # the key and position: required columns
        target.advance_applied(SOURCE, SCHEMA, Position(1, 1, 0))

    def library_upsert(self, sub: str, batches: list[pa.Table]) -> float:
        """PyIceberg's own ``Table.upsert`` of the same batches (no position guard, no
        deletes): what a user would write without this target."""
        catalog = self.make("plain").catalog
        table = catalog.create_table(("plain", sub.replace("-", "_")), schema=batches[0].schema)
        t0 = time.monotonic()
        for b in batches:
            table.upsert(b, join_cols=["id"])
        return time.monotonic() - t0

    def files(self, target) -> int:
        t = target._load(SCHEMA)
        return len(list(t.scan().plan_files())) if t.current_snapshot() else 0

    def last_merge(self, target) -> dict:
        summary = target._load(SCHEMA).current_snapshot().summary
        return {k: summary.get(k) for k in ("added-data-files", "deleted-data-files", "added-records",
                                             "deleted-records")}

    def unpruned_merge(self, target, batch: pa.Table) -> float:
        """The merge with no key bounds: every data file read."""
        from pyiceberg.expressions import AlwaysTrue
        from airflow_provider_dblog.engine.targets import iceberg_rows
        real = iceberg_rows.key_bounds
        iceberg_rows.key_bounds = lambda *args: AlwaysTrue()
        try:
            return merge(target, batch, 199)
        finally:
            iceberg_rows.key_bounds = real


KINDS = {"delta": DeltaKind, "iceberg": IcebergKind}


def merge(target, batch: pa.Table, log_no: int) -> float:
    t0 = time.monotonic()
    target.merge_batch(SCHEMA, batch, SOURCE, Position(log_no, 1, 0), run_id=f"bench-{log_no}")
    return time.monotonic() - t0


def mixed_batch(rng, size: int, hot_lo: int, next_id: int, log_no: int) -> pa.Table:
    """60% updates and 10% deletes of keys in [hot_lo, next_id), 30% new keys from next_id."""
    n_upd, n_del = int(size * 0.6), int(size * 0.1)
    old = rng.choice(np.arange(hot_lo, next_id), n_upd + n_del, replace=False)
    new = np.arange(next_id, next_id + size - n_upd - n_del)
    ids = np.concatenate([old, new])
    ops = [UPDATE] * n_upd + [DELETE] * n_del + [INSERT] * len(new)
    return rows(ids, positions(log_no, len(ids)), ops, log_no)


def phase_apply(kind, a) -> dict:
    out = {}
    for mode in ("insert", "recent", "uniform"):
        target, n, per = kind.target(f"apply-{mode}"), a.apply_rows, a.apply_rows // a.apply_batches
        batches, next_id = [], 0
        for i in range(a.apply_batches):
            if mode != "insert" and next_id:
                half, lo = per // 2, max(0, next_id - a.hot) if mode == "recent" else 0
                ids = np.concatenate([lo + np.random.default_rng(i).choice(next_id - lo, half, replace=False),
                                      np.arange(next_id, next_id + per - half)])
                ops = [UPDATE] * half + [INSERT] * (per - half)
            else:
                ids, ops = np.arange(next_id, next_id + per), INSERT
            next_id += per if isinstance(ops, str) else per - per // 2
            batches.append(rows(ids, positions(10 + i, per), ops, i))
        t0 = time.monotonic()
        for i, b in enumerate(batches):
            merge(target, b, 10 + i)
        merge_s = time.monotonic() - t0
        t0 = time.monotonic()
        kind.plain_append(f"append-{mode}", batches)
        append_s = time.monotonic() - t0
        out[mode] = {"rows": n, "batches": a.apply_batches, "merge_s": round(merge_s, 3),
                     "append_s": round(append_s, 3), "merge_rows_s": round(n / merge_s),
                     "append_rows_s": round(n / append_s), "ratio": round(append_s / merge_s, 3)}
        if mode != "insert":   # the library's own upsert of the same batches: > 1 means ours is faster
            upsert_s = kind.library_upsert(f"upsert-{mode}", batches)
            out[mode] |= {"upsert_s": round(upsert_s, 3), "vs_upsert": round(upsert_s / merge_s, 3)}
        log.info("apply %s: %s", mode, out[mode])
    return out


def phase_size(kind, a) -> dict:
    out, tables = {}, {}
    for label, total in (("small", a.small_rows), ("big", a.big_rows)):
        target = kind.target(f"size-{label}")
        t0 = time.monotonic()
        kind.build(target, total)
        tables[label] = [target, total, np.random.default_rng(7), [], []]   # target, next id, rng, times, metrics
        out[label] = {"rows": total, "build_s": round(time.monotonic() - t0, 1), "files": kind.files(target)}
    for r in range(a.repeat):   # alternating, so both sizes see the same load on a shared host
        for label, (target, next_id, rng, times, metrics) in tables.items():
            batch = mixed_batch(rng, a.batch, max(0, next_id - a.hot), next_id, 100 + r)
            times.append(merge(target, batch, 100 + r))
            metrics.append(kind.last_merge(target))
            tables[label][1] = next_id + int(batch[OP_COLUMN].to_pylist().count(INSERT))
    for label, (target, next_id, rng, times, metrics) in tables.items():
        # context, once each: the merge before pruning, and keys spread over the whole table
        unpruned = kind.unpruned_merge(target, mixed_batch(rng, a.batch, max(0, next_id - a.hot), next_id, 200))
        next_id += a.batch - int(a.batch * 0.7)
        uniform = merge(target, mixed_batch(rng, a.batch, 0, next_id, 300), 300)
        out[label] |= {"merge_s": [round(x, 3) for x in times], "median_s": round(statistics.median(times), 3),
                       "merge_files": metrics, "unpruned_s": round(unpruned, 3), "uniform_s": round(uniform, 3),
                       "uniform_files": kind.last_merge(target)}
        log.info("size %s: %s", label, out[label])
    out["ratio"] = round(out["big"]["median_s"] / out["small"]["median_s"], 2)
    out["unpruned_ratio"] = round(out["big"]["unpruned_s"] / out["small"]["unpruned_s"], 2)
    return out


def phase_files(kind, a) -> dict:
    target = kind.target("files")
    kind.build(target, a.small_rows)
    rng, next_id = np.random.default_rng(11), a.small_rows
    t0 = time.monotonic()
    for i in range(a.applies):   # new keys only (an append-mostly table): a new small file each
        merge(target, rows(np.arange(next_id, next_id + a.apply_size), positions(1000 + i, a.apply_size),
                           INSERT, i), 1000 + i)
        next_id += a.apply_size
    applies_s = time.monotonic() - t0
    before, count, pos = kind.files(target), target.count(SCHEMA), target.applied_pos(SOURCE, SCHEMA)
    rep = target.maintain(SCHEMA).to_dict()
    assert target.count(SCHEMA) == count and target.applied_pos(SOURCE, SCHEMA) == pos, "maintain changed the table"
    t0 = time.monotonic()
    merge(target, mixed_batch(rng, a.apply_size, 0, next_id, 5000), 5000)
    return {"applies": a.applies, "rows_per_apply": a.apply_size, "applies_s": round(applies_s, 2),
            "files_before": before, "files_after": rep["files_after"],
            "maintain": rep, "apply_after_maintain_s": round(time.monotonic() - t0, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lake", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="output directory (default .dblog-local/bench/lake-<time>)")
    p.add_argument("--kinds", default="delta", help=f"comma-separated: {', '.join(KINDS)}")
    p.add_argument("--only", default="apply,size,files", help="comma-separated phases: apply, size, files")
    p.add_argument("--work", default=None, help="where the tables are written (default: <out>/tables)")
    p.add_argument("--apply-rows", type=int, default=1_000_000)
    p.add_argument("--apply-batches", type=int, default=5)
    p.add_argument("--small-rows", type=int, default=100_000)
    p.add_argument("--big-rows", type=int, default=10_000_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--hot", type=int, default=100_000, help="updates and deletes hit the newest HOT keys")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--applies", type=int, default=100)
    p.add_argument("--apply-size", type=int, default=100, help="rows per small apply (phase files)")
    p.add_argument("--keep", action="store_true", help="keep the tables")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_provider_dblog").setLevel(logging.WARNING)
    out = Path(a.out or f".dblog-local/bench/lake-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": vars(a)}
    phases = {"apply": phase_apply, "size": phase_size, "files": phase_files}
    for name in a.kinds.split(","):
        work = Path(a.work or out / "tables") / name
        shutil.rmtree(work, ignore_errors=True)
        kind = KINDS[name](work)
        result[name] = {}
        for ph in a.only.split(","):
            t0 = time.monotonic()
            result[name][ph] = phases[ph](kind, a) | {"phase_s": round(time.monotonic() - t0, 1)}
            (out / "lake.json").write_text(json.dumps(result, indent=2, default=str))
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
