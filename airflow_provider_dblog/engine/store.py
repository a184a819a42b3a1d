"""The event log on files: Parquet per table, named by position.

Layout under ``<root>/events/<source>/<db.table>/``:

* ``log-<checkpoint>.<writer>[.<part>].parquet``: the tail's log events of one flush, named
  by the checkpoint the flush started from and by the writing tail's fencing number (and
  a part number: a transaction larger than a flush is written in parts as it is read,
  all named by the flush's start, so every file starts at a commit point). A tail
  deletes the files at or past its checkpoint when it starts (a flush that never
  committed). A tail paused past its lease (a zombie) may still write a file after
  another tail took over from the same checkpoint: its own name keeps it from replacing
  the live tail's file, and what it holds are events of the same log at the same
  positions, which readers drop as duplicates. (``log-<checkpoint>.parquet``, the
  name before fencing numbers, is still read.)
* ``snap-<hw position>.parquet``: one window's surviving chunk rows.
* ``schema-<position>.json``: a schema version of the table, holding from that position
  on (engine/schema_history.py): what the tail decoded the log with from there.

Files are written to a temporary name and renamed, so a reader never sees half
a file. Log events are committed only below the tail's checkpoint; readers pass
that bound, and the tail deletes log files at or beyond it when it restarts.

Chunk rows selected by a dump (before reconciliation) live in
``<root>/chunks/<source>/<request>/<db.table>/<window>/``; a verification's reconciled
chunks (engine/verify_run.py) in ``<root>/verify/<source>/<request>/<db.table>/<lw>_<hw>.parquet``.
"""
from __future__ import annotations

import json
import posixpath
import uuid
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .events import Event, event_arrow_schema, events_from_arrow, events_to_arrow
from .positions import Position
from .schema import TableSchema

LOG_PREFIX, SNAP_PREFIX, SUFFIX = "log-", "snap-", ".parquet"
SCHEMA_PREFIX, SCHEMA_SUFFIX = "schema-", ".json"


def _file_pos(name: str) -> Position:
    base = name.rsplit("/", 1)[-1]
    for prefix in (LOG_PREFIX, SNAP_PREFIX):
        if base.startswith(prefix) and base.endswith(SUFFIX):
            return Position.decode(base[len(prefix):-len(SUFFIX)].split(".", 1)[0])
    raise ValueError(f"not an event file: {name}")


def log_segment_name(checkpoint: Position, writer: str, part: int = 0) -> str:
    """``log-<checkpoint>.<writer>.parquet``; ``writer``: the tail's fencing number; a
    ``part`` after the first (a transaction written as it was read) adds ``.<part>``."""
    if not writer.isalnum():
        raise ValueError(f"segment writer must be alphanumeric, not {writer!r}")
    return f"{LOG_PREFIX}{checkpoint.encode()}.{writer}{f'.{part}' if part else ''}{SUFFIX}"


class EventStore:
    def __init__(self, root: str, source: str):
        if "://" in root:
            self.fs, path = pafs.FileSystem.from_uri(root)
        else:
            self.fs, path = pafs.LocalFileSystem(), root
        self.root = path.rstrip("/")
        self.source = source
        self.uri_root = root.rstrip("/")

    # -- paths -------------------------------------------------------------
    def table_dir(self, table: str) -> str:
        return posixpath.join(self.root, "events", self.source, table)

    def table_uri(self, table: str) -> str:
        """The same directory as a URI, for Spark."""
        base = self.uri_root if "://" in self.uri_root else "file://" + self.uri_root
        return posixpath.join(base, "events", self.source, table)

    def chunk_dir(self, request_id: str, table: str, window_id: str) -> str:
        return posixpath.join(self.root, "chunks", self.source, request_id, table, window_id)

    def chunk_uri(self, request_id: str, table: str, window_id: str) -> str:
        base = self.uri_root if "://" in self.uri_root else "file://" + self.uri_root
        return posixpath.join(base, "chunks", self.source, request_id, table, window_id)

    def stage_dir(self, table: str, run_id: str) -> str:
        return posixpath.join(self.root, "stage", self.source, table, run_id)

    def stage_uri(self, table: str, run_id: str) -> str:
        """Where a Spark apply writes a batch's flattened rows, for the driver to COPY."""
        base = self.uri_root if "://" in self.uri_root else "file://" + self.uri_root
        return posixpath.join(base, "stage", self.source, table, run_id)

    def read_stage(self, table: str, run_id: str, batch_rows: int = 50_000):
        """The stage rows a Spark apply wrote, as Arrow tables of at most ``batch_rows``."""
        for info in sorted(self._files(self.stage_dir(table, run_id)), key=lambda i: i.path):
            if info.base_name.endswith(".parquet") and not info.base_name.startswith((".", "_")):
                with self.fs.open_input_file(info.path) as f:
                    for rb in pq.ParquetFile(f).iter_batches(batch_size=batch_rows):
                        yield pa.Table.from_batches([rb])

    def remove_stage(self, table: str, run_id: str) -> None:
        path = self.stage_dir(table, run_id)
        if self.fs.get_file_info(path).type == pafs.FileType.Directory:
            self.fs.delete_dir(path)

    # -- writing -----------------------------------------------------------
    def _write_atomic(self, path: str, data: pa.Table) -> None:
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        pq.write_table(data, tmp, filesystem=self.fs, compression="zstd")
        self.fs.move(tmp, path)  # atomic rename on local and HDFS

    def write_log_segment(self, table: TableSchema, checkpoint: Position, events: list[Event],
                          writer: str, part: int = 0) -> str:
        path = posixpath.join(self.table_dir(table.qualified), log_segment_name(checkpoint, writer, part))
        self._write_atomic(path, events_to_arrow(table, events))
        return path

    def write_schema_version(self, table: str, pos: Position, version: dict) -> str:
        """A schema version of ``table`` holding from ``pos`` (a source's describe_table),
        written before any event decoded with it (a replay writes the same name again)."""
        path = posixpath.join(self.table_dir(table), f"{SCHEMA_PREFIX}{pos.encode()}{SCHEMA_SUFFIX}")
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(version, sort_keys=True).encode())
        self.fs.move(tmp, path)
        return path

    def captured_tables(self, tables) -> set[str]:
        """Those of ``tables`` the tail has recorded a schema version of (it reads them)."""
        return {t for t in tables if any(info.base_name.startswith(SCHEMA_PREFIX)
                                         for info in self._files(self.table_dir(t)))}

    def schema_version_files(self, table: str, listed: list[pafs.FileInfo] | None = None) -> list[tuple[Position, str]]:
        """``(position, path)`` of the table's schema versions, in position order, unread."""
        out = []
        for info in self._table_files(table, listed):
            name = info.base_name
            if name.startswith(SCHEMA_PREFIX) and name.endswith(SCHEMA_SUFFIX):
                out.append((Position.decode(name[len(SCHEMA_PREFIX):-len(SCHEMA_SUFFIX)]), info.path))
        return sorted(out, key=lambda v: v[0])

    def read_schema_version(self, path: str) -> dict:
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())

    def schema_versions(self, table: str, listed: list[pafs.FileInfo] | None = None) -> list[tuple[Position, dict]]:
        """The table's schema versions, in position order."""
        return [(pos, self.read_schema_version(path)) for pos, path in self.schema_version_files(table, listed)]

    def write_snapshot(self, table: TableSchema, hw: Position, data: pa.Table) -> str:
        """``data`` has the event schema (built by the reconciler)."""
        path = posixpath.join(self.table_dir(table.qualified), f"{SNAP_PREFIX}{hw.encode()}{SUFFIX}")
        self._write_atomic(path, data.cast(event_arrow_schema(table)))
        return path

    def verified_dir(self, request_id: str, table: str) -> str:
        return posixpath.join(self.root, "verify", self.source, request_id, table)

    def write_verified(self, request_id: str, table: TableSchema, lw: Position, hw: Position,
                       data: pa.Table) -> None:
        """A verification's reconciled chunk (the event schema: the source's rows as of the
        HW, and deletes of requested keys it lacks), named by its window's LW and HW."""
        path = posixpath.join(self.verified_dir(request_id, table.qualified), f"{lw.encode()}_{hw.encode()}{SUFFIX}")
        self._write_atomic(path, data.cast(event_arrow_schema(table)))

    def read_verified(self, request_id: str, table: TableSchema) -> list[tuple[Position, Position, pa.Table]]:
        """Each reconciled chunk of a verification: (LW, HW, its events), in LW order."""
        out = []
        for info in self._files(self.verified_dir(request_id, table.qualified)):
            name = info.base_name
            if name.endswith(SUFFIX) and ".tmp-" not in name:
                lw, hw = name[:-len(SUFFIX)].split("_")
                data = pq.read_table(info.path, filesystem=self.fs, schema=event_arrow_schema(table))
                out.append((Position.decode(lw), Position.decode(hw), data))
        return sorted(out, key=lambda c: c[0])

    def remove_verified(self, request_id: str) -> None:
        path = posixpath.join(self.root, "verify", self.source, request_id)
        if self.fs.get_file_info(path).type == pafs.FileType.Directory:
            self.fs.delete_dir(path)

    def write_chunk(self, request_id: str, table: str, window_id: str, rows: pa.Table) -> None:
        path = posixpath.join(self.chunk_dir(request_id, table, window_id), "part-0.parquet")
        self._write_atomic(path, rows)

    def read_chunk(self, request_id: str, table: str, window_id: str) -> pa.Table:
        """The chunk rows a select wrote (Spark part files or write_chunk's one file)."""
        files = [i.path for i in self._files(self.chunk_dir(request_id, table, window_id))
                 if i.base_name.endswith(".parquet") and not i.base_name.startswith((".", "_"))
                 and ".tmp-" not in i.base_name]
        if not files:
            raise FileNotFoundError(f"no chunk rows for window {window_id} of {table}")
        return pa.concat_tables([pq.read_table(f, filesystem=self.fs) for f in sorted(files)],
                                promote_options="default")

    def remove_chunk(self, request_id: str, table: str, window_id: str) -> None:
        """Chunk rows are transient: once the snapshot is durable they are dropped."""
        path = self.chunk_dir(request_id, table, window_id)
        if self.fs.get_file_info(path).type == pafs.FileType.Directory:
            self.fs.delete_dir(path)

    def remove_uncommitted_logs(self, checkpoint: Position) -> list[str]:
        """Log files at or past the checkpoint were written by a flush that never committed;
        schema versions past it, by a tail that never got there (the replay records them
        again, as the catalog then says)."""
        removed = []
        for info in self._files(posixpath.join(self.root, "events", self.source), recursive=True):
            base = info.path.rsplit("/", 1)[-1]
            if base.startswith(LOG_PREFIX) and base.endswith(SUFFIX) and _file_pos(base) >= checkpoint:
                self.fs.delete_file(info.path)
                removed.append(info.path)
            elif (base.startswith(SCHEMA_PREFIX) and base.endswith(SCHEMA_SUFFIX)
                  and Position.decode(base[len(SCHEMA_PREFIX):-len(SCHEMA_SUFFIX)]) > checkpoint):
                self.fs.delete_file(info.path)
                removed.append(info.path)
            elif ".tmp-" in base and base.startswith(LOG_PREFIX):
                # a log file half written by a dead tail (or a zombie's, which then fails);
                # not a dump runner's snapshot being written right now
                self.fs.delete_file(info.path)
        return removed

    def remove_source(self) -> list[str]:
        """Delete every event file, chunk row and stage file of this source (``dblog reset``)."""
        removed = []
        for area in ("events", "chunks", "stage"):
            path = posixpath.join(self.root, area, self.source)
            if self.fs.get_file_info(path).type == pafs.FileType.Directory:
                self.fs.delete_dir(path)
                removed.append(path)
        return removed

    # -- reading -----------------------------------------------------------
    def file_positions(self) -> list[Position]:
        """The position in the name of every event file of this source, all tables."""
        return [_file_pos(i.base_name)
                for i in self._files(posixpath.join(self.root, "events", self.source), recursive=True)
                if i.base_name.endswith(SUFFIX) and ".tmp-" not in i.base_name]

    def _files(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        sel = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
        return [i for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File]

    def tables(self) -> list[str]:
        sel = pafs.FileSelector(posixpath.join(self.root, "events", self.source), allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.Directory)

    def listing(self) -> dict[str, list[pafs.FileInfo]]:
        """Every table's files, from one listing of the source's folder (an apply run's
        survey of many tables: engine/apply_survey.py); pass a table's to the methods that
        take ``listed`` instead of listing its folder again."""
        base = posixpath.join(self.root, "events", self.source)
        out: dict[str, list[pafs.FileInfo]] = {}
        for info in self._files(base, recursive=True):
            table, _, name = posixpath.relpath(info.path, base).partition("/")
            if name and "/" not in name:   # (a table's own files only)
                out.setdefault(table, []).append(info)
        return out

    def _table_files(self, table: str, listed: list[pafs.FileInfo] | None) -> list[pafs.FileInfo]:
        return self._files(self.table_dir(table)) if listed is None else listed

    def files_for_range(self, table: str, lo: Position | None, hi: Position,
                        listed: list[pafs.FileInfo] | None = None) -> list[str]:
        """Files that may hold events with lo < pos < hi (``listed``: the table's files, as
        :meth:`listing` found them).

        A log file holds positions from its name up to the next log file's name (a later
        start: files with the same start, a transaction's parts or a zombie tail's file,
        are all read, and duplicates dropped); a snapshot file holds its HW position plus
        row indexes. Every log file starts at a commit point (a checkpoint), and a live
        tail's file ends at the next one, so no file of any writer starts inside another's
        range: a file skipped as "before lo" holds nothing at or past lo that the live
        tail's files do not.
        """
        logs, snaps = [], []
        for info in self._table_files(table, listed):
            if ".tmp-" in info.base_name or not info.base_name.endswith(SUFFIX):
                continue
            (logs if info.base_name.startswith(LOG_PREFIX) else snaps).append(
                (_file_pos(info.base_name), info.path))
        logs.sort()
        starts = sorted({start for start, _ in logs})
        after = {a: b for a, b in zip(starts, starts[1:])}  # each start's next, later start
        chosen = []
        for start, path in logs:
            nxt = after.get(start)
            if start >= hi or (lo is not None and nxt is not None and nxt <= lo):
                continue
            chosen.append(path)
        chosen += [p for start, p in snaps
                   if start < hi and (lo is None or (start.log, start.offset) >= (lo.log, lo.offset))]
        return chosen

    def files_with_events(self, table: str, lo: Position | None, hi: Position,
                          listed: list[pafs.FileInfo] | None = None) -> list[str]:
        """files_for_range, less the files without an event at lo <= pos < hi (read by their
        ``pos`` alone): a file named before a change of the table's shape may hold only
        events before it, in the earlier shape, which a read of the range in its own shape
        must not open. A file whose ``pos`` statistics (Parquet's min and max, bounds by the
        format's rule) lie wholly outside the range is left out unread."""
        out = []
        for path in self.files_for_range(table, lo, hi, listed):
            if self._pos_outside(path, lo, hi):
                continue
            pos = pq.read_table(path, columns=["pos"], filesystem=self.fs)["pos"]
            inside = pc.less(pos, hi.encode())
            if lo is not None:
                inside = pc.and_(inside, pc.greater_equal(pos, lo.encode()))
            if pc.any(inside).as_py():
                out.append(path)
        return out

    def _pos_outside(self, path: str, lo: Position | None, hi: Position) -> bool:
        """Whether the file's ``pos`` statistics show no position in ``[lo, hi)`` (False when
        a row group has none: the file is read)."""
        md = pq.read_metadata(path, filesystem=self.fs)
        if md.num_row_groups == 0:
            return True
        first = md.row_group(0)   # (``pos`` is the third leaf from the end: events.event_arrow_schema)
        column = next((j for j in [md.num_columns - 3, *range(md.num_columns)]
                       if j >= 0 and first.column(j).path_in_schema == "pos"), None)
        if column is None:
            return False
        low = high = None
        for i in range(md.num_row_groups):
            stats = md.row_group(i).column(column).statistics
            if stats is None or not stats.has_min_max:
                return False
            low = stats.min if low is None else min(low, stats.min)
            high = stats.max if high is None else max(high, stats.max)
        return low >= hi.encode() or (lo is not None and high < lo.encode())

    def read_range(self, table: TableSchema, lo: Position | None, hi: Position,
                   ops: Iterable[str] | None = None) -> pa.Table:
        """Events of one table with lo < pos < hi, deduplicated and in position order."""
        schema = event_arrow_schema(table)
        parts = [pq.read_table(p, filesystem=self.fs, schema=schema)
                 for p in self.files_with_events(table.qualified, lo, hi)]
        data = pa.concat_tables(parts) if parts else schema.empty_table()
        mask = pc.less(data["pos"], hi.encode())
        if lo is not None:
            mask = pc.and_(mask, pc.greater(data["pos"], lo.encode()))
        if ops is not None:
            mask = pc.and_(mask, pc.is_in(data["op"], pa.array(list(ops))))
        data = data.filter(mask)
        # a replayed flush may have left the same event in two files: keep one
        data = data.sort_by([("pos", "ascending")])
        if data.num_rows > 1:
            pos = data["pos"]
            keep = pc.not_equal(pos.slice(1), pos.slice(0, data.num_rows - 1))
            data = data.filter(pa.concat_arrays([pa.array([True]), keep.combine_chunks()]))
        return data

    def read_events(self, table: TableSchema, lo: Position | None, hi: Position) -> list[Event]:
        return events_from_arrow(table, self.read_range(table, lo, hi))
