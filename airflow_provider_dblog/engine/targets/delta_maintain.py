"""The layout of a Delta current-state table (issue 28): merges that prune files, and the
maintenance that keeps the files few and key-clustered.

**Pruning.** delta-rs rewrites only the files a MERGE matches, but with a streamed source
and a bare ``t.k = s.k`` it *reads* every file to find them: the cost grows with the table.
So each batch's key values are gathered as the pages pass (:class:`KeySpan`) and the MERGE
predicate gets literal bounds (``t.k >= lo AND t.k <= hi``, for the leading key column up
to :data:`MAX_RANGES` ranges split at the batch's widest gaps) that delta-rs prunes files
with, by their min/max statistics. Every key of the batch lies inside the bounds, so a
target row that matches a batch row by key does too: the MERGE's outcome is unchanged. A
bound is written only for a type rendered exactly (integers, strings, decimals); for any
other key type that column is simply not bounded. The pages are spooled (to a temporary
Arrow file when they come as a stream, e.g. from Spark) so they can be read after their
keys are known, never held whole in memory.

**File size.** A MERGE without deletion vectors rewrites every file it touches, so the
files of a current-state table are kept small (:data:`FILE_SIZE`, the table's
``delta.targetFileSize``): a 10k-row batch costs about the same in a 10M-row table as
in a 100k-row one (``python -m bench.lake``).

**Maintenance** (:func:`maintain`, ``dblog maintain``): compaction (optionally z-ordered by
the key) and vacuum. Both are ``dataChange=false`` commits that carry no
``dblog.applied.<source>`` key, so the applied position is still read from the apply's own
commits; they carry the position they saw as ``dblog.carried.<source>``, used only when the
apply's commits are no longer in the log (expired by log retention). A MERGE racing a
compaction either commits or fails with CommitFailedError, which the apply retries
(``DeltaTarget.is_transient``); a compaction that loses the race is retried here.
"""
from __future__ import annotations

import contextlib
import decimal
import logging
import os
import tempfile
import time
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.fs import DeltaStorageHandler
from deltalake.exceptions import CommitFailedError, DeltaError

from .base import OP_COLUMN, POS_COLUMN, MaintainReport

log = logging.getLogger(__name__)

FILE_SIZE = 4 << 20      # bytes: the target size of a current-state table's files
MAX_RANGES = 16          # ranges of the leading key column in a MERGE predicate
APPLIED = "dblog.applied."   # + source: the applied position (an apply's commit)
CARRIED = "dblog.carried."   # + source: the position a maintenance commit saw
MAINTENANCE = "dblog.maintenance"


def table_configuration() -> dict[str, str]:
    """The table properties a current-state table is created with."""
    return {"delta.targetFileSize": str(FILE_SIZE)}


def quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _bounded(type_: pa.DataType) -> bool:
    """A key type :func:`literal` renders (others are left unbounded)."""
    return (pa.types.is_signed_integer(type_) or pa.types.is_string(type_) or pa.types.is_large_string(type_)
            or pa.types.is_decimal(type_))


def literal(value, type_: pa.DataType) -> str | None:
    """``value`` as an exact SQL literal of ``type_`` for delta-rs, or None (not bounded)."""
    if pa.types.is_integer(type_) and pa.types.is_signed_integer(type_):
        # int64's minimum has no positive twin to negate: left unbounded (always true)
        return str(int(value)) if int(value) > -(1 << 63) else None
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "'" + value.replace("'", "''") + "'" if "\x00" not in value else None
    if pa.types.is_decimal(type_) and isinstance(value, decimal.Decimal) and value.is_finite():
        return f"CAST('{format(value, 'f')}' AS DECIMAL({type_.precision},{type_.scale}))"
    return None


class KeySpan:
    """The key values of a batch, gathered page by page: its MERGE pruning predicate."""

    def __init__(self, key: list[str], schema: pa.Schema):
        self.key, self.types = key, [schema.field(k).type for k in key]
        self.lead: list[pa.Array] = []              # the leading column's values, per page
        self.spans: list[tuple] | None = []         # per page (integers): (min, max) when no wider than its rows
        self.bounds: list[tuple] = [(None, None)] * len(key)
        self.rows = 0
        self._ranges: list[tuple] | None = None

    def add(self, page: pa.Table) -> None:
        if not page.num_rows:
            return
        self.rows += page.num_rows
        self._ranges = None
        if _bounded(self.types[0]):
            col = page[self.key[0]].combine_chunks()
            self.lead.append(col)
            if self.spans is not None and pa.types.is_integer(self.types[0]):
                mm = pc.min_max(col).as_py()   # a dense page (e.g. new keys in order): its span, no sort
                dense = mm["max"] - mm["min"] < page.num_rows
                self.spans = self.spans + [(mm["min"], mm["max"])] if dense else None
            else:
                self.spans = None
        for i, k in enumerate(self.key[1:], 1):
            if not _bounded(self.types[i]):
                continue
            mm = pc.min_max(page[k]).as_py()
            lo, hi = self.bounds[i]
            self.bounds[i] = (mm["min"] if lo is None else min(lo, mm["min"]),
                              mm["max"] if hi is None else max(hi, mm["max"]))

    def misses(self, dt) -> bool:
        """Whether no file of ``dt`` can hold a key of the batch: each file's statistics of
        the leading key column (an integer: exact) lie outside the batch's ranges; a file
        without them may hold any key. Such a batch's MERGE needs no matched clauses (it
        still reads the same key ranges: a racing commit into them conflicts as before)."""
        if not self.rows or not pa.types.is_signed_integer(self.types[0]) or not self.lead:
            return False
        files = pa.table(dt.get_add_actions(flatten=True))
        lo_col, hi_col = f"min.{self.key[0]}", f"max.{self.key[0]}"
        if files.num_rows == 0:
            return True
        if lo_col not in files.column_names or hi_col not in files.column_names or \
                files[lo_col].null_count or files[hi_col].null_count:
            return False
        lo, hi = files[lo_col].to_numpy(), files[hi_col].to_numpy()
        return not any(np.any((lo <= b) & (hi >= a)) for a, b in self._lead_ranges())

    def _lead_ranges(self) -> list[tuple]:
        if not self.lead:
            return []
        if self._ranges is None:
            self._ranges = self._ranges_of_lead()
        return self._ranges

    def _ranges_of_lead(self) -> list[tuple]:
        if self.spans:   # every page dense: their spans, joined where they touch (each holds every key of its page)
            joined: list[list] = []
            for lo, hi in sorted(self.spans):
                if joined and lo <= joined[-1][1] + 1:
                    joined[-1][1] = max(joined[-1][1], hi)
                else:
                    joined.append([lo, hi])
            if len(joined) <= MAX_RANGES:
                return [(lo, hi) for lo, hi in joined]
        values = pc.unique(pa.chunked_array(self.lead, self.types[0]))
        values = values.take(pc.sort_indices(values))
        if pa.types.is_integer(self.types[0]) and len(values) > 1:
            # split at the widest gaps (in float only to rank them; the bounds stay exact)
            ints = values.to_numpy()
            gaps = np.diff(ints.astype(np.float64))
            cut = np.sort(np.argsort(gaps)[::-1][:MAX_RANGES - 1])
            cut = cut[gaps[cut] > 1]
            starts, ends = np.concatenate(([0], cut + 1)), np.concatenate((cut, [len(ints) - 1]))
            return [(int(ints[s]), int(ints[e])) for s, e in zip(starts, ends)]
        return [(values[0].as_py(), values[-1].as_py())]

    def predicate(self, alias: str = "t") -> str:
        """Conjuncts (`` AND ...``) every key of the batch satisfies, or "" (nothing to bound)."""
        if not self.rows:
            return ""
        parts = []
        lead = [self._bound(alias, self.key[0], self.types[0], lo, hi) for lo, hi in self._lead_ranges()]
        if lead and all(lead):
            parts.append("(" + " OR ".join(lead) + ")" if len(lead) > 1 else lead[0])
        for k, t, (lo, hi) in zip(self.key[1:], self.types[1:], self.bounds[1:]):
            if lo is not None and (b := self._bound(alias, k, t, lo, hi)):
                parts.append(b)
        return "".join(f" AND {p}" for p in parts)

    @staticmethod
    def _bound(alias: str, col: str, type_: pa.DataType, lo, hi) -> str:
        c = f"{alias}.{quote_name(col)}"
        lo_s, hi_s = literal(lo, type_), literal(hi, type_)
        if lo == hi and lo_s is not None:
            return f"{c} = {lo_s}"
        out = ([f"{c} >= {lo_s}"] if lo_s is not None else []) + ([f"{c} <= {hi_s}"] if hi_s is not None else [])
        return "(" + " AND ".join(out) + ")" if out else ""


@contextlib.contextmanager
def spooled(schema: pa.Schema, pages: Iterable[pa.Table], in_memory: bool) -> Iterator[pa.RecordBatchReader]:
    """The pages read to the end (so their keys are known) and given back as one stream:
    kept in memory when they are in memory already, else through a temporary Arrow file."""
    if in_memory:
        kept = [b for page in pages for b in page.to_batches()]
        yield pa.RecordBatchReader.from_batches(schema, kept)
        return
    with tempfile.TemporaryDirectory(prefix="dblog-merge-") as tmp:
        path = os.path.join(tmp, "batch.arrows")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema) as w:
            for page in pages:
                w.write_table(page)
        with pa.memory_map(path) as src:
            yield pa.ipc.open_stream(src)


def applied_in(dt: DeltaTable, source: str, upto: int | None = None) -> str | None:
    """The encoded applied position of ``source`` ("" after a reset, None if never): from
    the newest apply commit that carries it; a maintenance commit's carried copy only when
    no apply commit of that source is left in the log (expired). ``upto``: as of that version."""
    key, kept, carried, limit = APPLIED + source, CARRIED + source, None, 64
    while True:
        history = dt.history(limit)
        for commit in history:   # newest first
            if upto is not None and commit.get("version", -1) > upto:
                continue
            if key in commit:
                return commit[key]
            if carried is None and kept in commit:
                carried = commit[kept]
        if len(history) < limit:
            return carried
        limit *= 8


def key_columns(dt: DeltaTable) -> list[str]:
    """A current-state table's key: its non-nullable source columns (delta.arrow_schema)."""
    return [f.name for f in dt.schema().fields if not f.nullable and f.name not in (POS_COLUMN, OP_COLUMN)]


def _files(dt: DeltaTable) -> tuple[int, int]:
    sizes = pa.table(dt.get_add_actions(flatten=True))["size_bytes"]
    return len(sizes), int(pc.sum(sizes).as_py() or 0)


def _log_versions(uri: str, options: dict | None) -> int:
    listing = store_files(uri, "_delta_log", options)
    return sum(n.endswith(".json") for n in listing)


def store_files(root: str, under: str, options: dict | None, dirs: bool = False) -> list[str]:
    """The names of the files (or directories) right under ``root/under``, on a local path
    or an object store (delta-rs's own object store, with the target's storage options)."""
    if "://" not in root or root.startswith("file://"):
        d = os.path.join(root.removeprefix("file://"), under)
        return sorted(n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n)) == dirs) if os.path.isdir(d) else []
    kind = pafs.FileType.Directory if dirs else pafs.FileType.File
    fs = pafs.PyFileSystem(DeltaStorageHandler(root, options))
    infos = fs.get_file_info(pafs.FileSelector(under, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == kind)


def _props(dt: DeltaTable, source: str | None, what: str) -> CommitProperties:
    """A maintenance commit's metadata: what it is and the applied position it saw."""
    seen = applied_in(dt, source) if source else None
    return CommitProperties(custom_metadata={MAINTENANCE: what} | ({CARRIED + source: seen} if seen is not None else {}))


def maintain(uri: str, source: str | None = None, retention_hours: int = 168, dry_run: bool = False, z_order: bool = False,
             target_size: int | None = None, enforce_retention: bool = True, attempts: int = 5,
             storage_options: dict | None = None) -> MaintainReport:
    """Compact the table at ``uri`` (z-ordered by its key if asked) and vacuum files
    unreferenced for ``retention_hours``; its commits carry ``source``'s applied position. Readers of any version younger than the retention
    are unaffected; an apply running at the same time is not lost (module docstring)."""
    if retention_hours != int(retention_hours) or retention_hours < 0:
        raise ValueError(f"retention_hours must be a whole number of hours >= 0, not {retention_hours!r}")
    retention_hours = int(retention_hours)
    t0 = time.monotonic()
    dt = DeltaTable(uri, storage_options=storage_options)
    files0, bytes0 = _files(dt)
    version0, logs0 = dt.version(), _log_versions(uri, storage_options)
    key = key_columns(dt) if z_order else None
    if z_order and not key:
        raise ValueError(f"{uri}: no key columns to z-order by")
    size = target_size or FILE_SIZE
    try:   # a retention below the table's delta.deletedFileRetentionDuration: refused before any work
        dt.vacuum(retention_hours=retention_hours, dry_run=True, enforce_retention_duration=enforce_retention)
    except DeltaError as e:
        if "retention" not in str(e).lower():
            raise
        raise ValueError(f"{uri}: {e}") from None
    compacted = 0
    if not dry_run:
        for attempt in range(attempts):
            dt = DeltaTable(uri, storage_options=storage_options)
            props = _props(dt, source, "z_order" if key else "compact")
            try:
                if dt.metadata().configuration.get("delta.targetFileSize") != str(size):
                    dt.alter.set_table_properties({"delta.targetFileSize": str(size)}, commit_properties=props)
                opt = (dt.optimize.z_order(key, target_size=size, commit_properties=props) if key
                       else dt.optimize.compact(target_size=size, commit_properties=props))
                compacted = int(opt.get("numFilesRemoved", 0))
                break
            except CommitFailedError:   # an apply committed first: compact its new version
                if attempt == attempts - 1:
                    raise
                log.info("compaction of %s lost a race with a commit; again", uri)
    dt = DeltaTable(uri, storage_options=storage_options)
    props = _props(dt, source, "vacuum")
    vacuumed = dt.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                         enforce_retention_duration=enforce_retention, commit_properties=props)
    if not dry_run:
        dt.cleanup_metadata()   # log entries past delta.logRetentionDuration (30 days by default)
    dt = DeltaTable(uri, storage_options=storage_options)
    files1, bytes1 = _files(dt)
    rep = MaintainReport(table=os.path.basename(uri.rstrip("/")), files_before=files0, files_after=files1,
                         bytes_before=bytes0, bytes_after=bytes1, version_before=version0,
                         version_after=dt.version(), files_compacted=compacted, files_vacuumed=len(vacuumed),
                         versions_removed=max(0, logs0 - _log_versions(uri, storage_options)), z_order=key,
                         dry_run=dry_run, seconds=round(time.monotonic() - t0, 3))
    log.info("maintained Delta table %s: %s", uri, rep)
    return rep
