"""Maintenance of an Iceberg target table (iceberg.py): frequent copy-on-write merges and
appends leave many small data files and many snapshots.

- **compact**: the table's small data files (under half the target file size) rewritten
  into files sorted by key, in one snapshot (``dblog.maintenance: compact`` in its
  summary). Rows do not change and the applied position (a table property) is untouched;
  a merge committed meanwhile fails this commit, and the compaction runs again later.
- **expire**: snapshots older than the retention expire (the current one never does), and
  data files of the table's directory that no remaining snapshot references and that are
  older than the retention are deleted (local warehouses only: files of a killed commit,
  of expired snapshots). Readers of a snapshot within the retention are never broken.

Old metadata files are removed by Iceberg itself at each commit
(``write.metadata.delete-after-commit.enabled``, set when the table is created).
No Spark and no Airflow here.
"""
from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files, schema_to_pyarrow

from .base import MIN_RETENTION_HOURS as _MIN_RETENTION, POS_COLUMN, MaintainReport

TARGET_FILE_BYTES = 512 * 1024 * 1024   # Iceberg's default target file size
MIN_RETENTION_HOURS = float(_MIN_RETENTION["iceberg"])


def data_files(t) -> list:
    """The current snapshot's data files (scan tasks)."""
    return list(t.scan().plan_files()) if t.current_snapshot() is not None else []


def compact(t, key: list[str]) -> int:
    """Rewrite the small data files of ``t`` (under half its target file size) into sorted
    ones: how many it replaced."""
    target_file_bytes = int(t.properties.get("write.target-file-size-bytes", TARGET_FILE_BYTES))
    tasks = data_files(t)
    small = [task for task in tasks if task.file.file_size_in_bytes < target_file_bytes // 2]
    if len(small) < 2:
        return 0
    scan = ArrowScan(table_metadata=t.metadata, io=t.io, projected_schema=t.schema(), row_filter=AlwaysTrue())
    schema = schema_to_pyarrow(t.schema(), include_field_ids=False)
    data = pa.concat_tables([scan.to_table(tasks=[task]).cast(schema) for task in small])
    order = key or [c for c in (POS_COLUMN,) if c in data.column_names]   # a changelog table: by position
    data = data.sort_by([(k, "ascending") for k in order]) if data.num_rows and order else data
    txn = t.transaction()
    new = list(_dataframe_to_data_files(table_metadata=txn.table_metadata, df=data, io=t.io,
                                        write_uuid=uuid.uuid4())) if data.num_rows else []
    with txn.update_snapshot(snapshot_properties={"dblog.maintenance": "compact"}).overwrite() as snapshot:
        for task in small:
            snapshot.delete_data_file(task.file)
        for f in new:
            snapshot.append_data_file(f)
    txn.commit_transaction()
    return len(small)


def expire(t, retention_hours: float) -> tuple[int, int]:
    """Expire snapshots older than the retention and delete unreferenced data files older
    than it: (snapshots expired, files deleted)."""
    if retention_hours < MIN_RETENTION_HOURS:   # a running apply's files are unreferenced until its commit
        raise ValueError(f"retention must be at least {MIN_RETENTION_HOURS} hour(s), not {retention_hours}")
    cutoff = datetime.now(timezone.utc) - timedelta(hours=retention_hours)
    before = len(t.metadata.snapshots)
    t.maintenance.expire_snapshots().older_than(cutoff).commit()
    t = t.refresh()
    expired = before - len(t.metadata.snapshots)
    return expired, _delete_unreferenced(t, cutoff.timestamp())


def _delete_unreferenced(t, older_than: float) -> int:
    location = urlparse(t.location())
    if location.scheme not in ("", "file"):
        return 0   # object stores: left to the store's own lifecycle rules (README)
    root = os.path.join(location.path, "data")
    referenced = {urlparse(p).path for p in t.inspect.all_data_files().column("file_path").to_pylist()}
    deleted = 0
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if path not in referenced and name.endswith(".parquet") and os.path.getmtime(path) < older_than:
                os.remove(path)
                deleted += 1
    return deleted


def _sizes(t) -> tuple[int, int]:
    files = data_files(t)
    return len(files), sum(task.file.file_size_in_bytes for task in files)


def _snapshot_id(t) -> int | None:
    snap = t.current_snapshot()
    return snap.snapshot_id if snap is not None else None


def maintain(t, retention_hours: float, dry_run: bool = False) -> MaintainReport:
    """Compact (by the table's key, its identifier fields), then expire."""
    if retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(f"retention must be at least {MIN_RETENTION_HOURS} hour(s), not {retention_hours}")
    t0 = time.monotonic()
    files, size = _sizes(t)
    report = MaintainReport(t.name()[-1], files, files, size, size, _snapshot_id(t), _snapshot_id(t),
                            dry_run=dry_run)
    if not dry_run:
        report.files_compacted = compact(t, list(t.schema().identifier_field_names()))
        report.versions_removed, report.files_vacuumed = expire(t.refresh(), retention_hours)
        t = t.refresh()
        report.files_after, report.bytes_after = _sizes(t)
        report.version_after = _snapshot_id(t)
    report.seconds = round(time.monotonic() - t0, 3)
    return report
