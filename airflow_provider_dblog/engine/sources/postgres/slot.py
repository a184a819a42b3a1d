"""The replication slot and the publication a PostgreSQL source's log is read through.

- The publication holds the captured tables and the watermark table; the slot
  (plugin pgoutput) keeps the WAL from the last confirmed position on. Both are
  created when missing (``prepare``) and checked when present (``problems``).
- ``confirm`` records what the caller says is durable; the stream (stream.py) sends
  only that as its flush position, so the slot never drops WAL that is not saved.

Nothing here imports Airflow.
"""
from __future__ import annotations

import logging
import re
import time

import psycopg2.errors
from psycopg2 import sql

from ...errors import SourceSetupError, UnknownTableError
from ..base import Problem
from .catalog import partition_roots
from .ddl_marks import install as install_ddl_marks, uninstall as uninstall_ddl_marks
from .lsn import int_to_lsn, lsn_to_int

log = logging.getLogger(__name__)

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
SLOT_RELEASE_WAIT_S = 15.0   # how long a killed reader's walsender may take to exit
TAIL_APPLICATION = "dblog-tail"  # the application_name of the tail's replication connection
ACTIONS = ("pubinsert", "pubupdate", "pubdelete", "pubtruncate")


def check_slot_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _SLOT_NAME.match(name):
        raise SourceSetupError(f"{what} {name!r} must be 1-63 characters of a-z, 0-9 and _")
    return name


class SlotAndPublication:
    """The slot and publication of one PostgresSource (which it queries through)."""

    def __init__(self, source):
        self.source = source
        cfg = source.config
        self.slot_name = check_slot_name(cfg.slot or f"dblog_{cfg.name}".lower(), "slot name")
        self.publication = check_slot_name(cfg.publication or f"dblog_{cfg.name}".lower(),
                                           "publication name")
        self.captured = tuple(source.tables) + (source.watermark_table,)
        self.confirmed = 0   # the highest LSN the caller said is durable

    # -- publication and slot ----------------------------------------------------
    def _publication(self) -> tuple | None:
        rows = self.source._query(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication "
            "WHERE pubname = %s", (self.publication,))
        return rows[0] if rows else None

    def _published(self) -> dict[str, tuple]:
        """{schema.table: (column names published, row filter)} of the publication."""
        rows = self.source._query(
            "SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables "
            "WHERE pubname = %s", (self.publication,))
        return {f"{s}.{t}": (tuple(a or ()), f) for s, t, a, f in rows}

    def _column_listed(self) -> set[str]:
        """The tables the publication publishes with a column list (pg_publication_rel.prattrs,
        PostgreSQL 15; NULL: every column, also those added later)."""
        rows = self.source._query(
            "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel pr "
            "JOIN pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s AND pr.prattrs IS NOT NULL",
            (self.publication,))
        return {r[0] for r in rows}

    def _via_root_problems(self, pub: tuple, published: dict) -> list[Problem]:
        """publish_via_partition_root with an ancestor of a captured partition published: the
        partition's changes would come as the ancestor's, which the tail does not capture."""
        if not pub[5]:
            return []
        roots = partition_roots(self.source._query, [t for t in self.source.tables])
        return [Problem(f"publication {self.publication} has publish_via_partition_root = true and publishes "
                        f"{root}: the changes of its partition(s) {', '.join(parts)} would come as {root}'s, "
                        "and the captured partitions would get none",
                        f"ALTER PUBLICATION {self.publication} SET (publish_via_partition_root = false)", parts[0])
                for root, parts in roots.items() if pub[0] or root in published]

    def _slot(self) -> tuple | None:
        rows = self.source._query(
            "SELECT plugin, slot_type, database, confirmed_flush_lsn::text, active_pid "
            "FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,))
        return rows[0] if rows else None

    def problems(self) -> list[Problem]:
        """What is wrong with an existing slot or publication (missing ones are created)."""
        out = []
        pub = self._publication()
        if pub is not None:
            missing = [a[3:] for a, on in zip(ACTIONS, pub[1:]) if not on]
            if missing:
                out.append(Problem(
                    f"publication {self.publication} does not publish {', '.join(missing)}",
                    f"ALTER PUBLICATION {self.publication} SET (publish = "
                    "'insert, update, delete, truncate')"))
            published = self._published()
            listed = self._column_listed()
            out += self._via_root_problems(pub, published)
            for table in self.captured:
                if table not in published:
                    continue   # prepare() adds it
                cols, rowfilter = published[table]
                if rowfilter:
                    out.append(Problem(
                        f"publication {self.publication} filters the rows of {table} "
                        f"(WHERE {rowfilter}): changes would be lost",
                        f"ALTER PUBLICATION {self.publication} SET TABLE ... without a WHERE", table))
                if table in listed:   # a column list: a column left out (or added later) is lost
                    out.append(Problem(
                        f"publication {self.publication} publishes only the columns {list(cols)} of {table} "
                        "(a column list)", "publish every column (no column list)", table))
        slot = self._slot()
        if slot is not None:
            plugin, kind, database, _, _ = slot
            if kind != "logical" or plugin != "pgoutput":
                out.append(Problem(f"replication slot {self.slot_name} is a {kind} slot of plugin "
                                   f"{plugin}, not a logical pgoutput slot",
                                   "set another `slot:` for this source, or drop that slot"))
            elif database != self.source.config.endpoint.database:
                out.append(Problem(f"replication slot {self.slot_name} belongs to database {database}",
                                   "set another `slot:` for this source"))
        else:
            (free,), = self.source._query(
                "SELECT current_setting('max_replication_slots')::int - count(*) "
                "FROM pg_replication_slots")
            if free < 1:
                out.append(Problem("no free replication slot (max_replication_slots are all used)",
                                   "raise max_replication_slots, or drop an unused slot"))
        return out

    def prepare(self) -> None:
        """Create the publication and the slot if missing, add missing tables to the
        publication, and fail on anything that would lose changes. Run before the
        first checkpoint: the slot must exist before the position the tail starts at."""
        src = self.source
        src.ensure_watermark_table()
        why = install_ddl_marks(src._query, src.namespace)
        if why:
            log.warning("source %s: no event trigger marks ALTER TABLE / ALTER TYPE in the log (%s): an enum label "
                        "renamed or a column rewritten by ALTER ... TYPE ... USING changes values with nothing in "
                        "the log, and goes unseen. Run the tail once as a superuser to create it (README: Schema "
                        "changes)", src.name, why)
        first = self._slot() is None
        present = []
        for table in src.tables:
            try:
                src.table_schema(table)   # unknown tables / no primary key: fail here
                present.append(table)
            except UnknownTableError:
                if first:
                    raise
                # captured already (the slot exists): gone since, only it stops (the tail
                # quarantines it, engine/tail_shapes.py)
                log.warning("%s is not in the catalog of source %s: only it stops", table, src.name)
        pub = self._publication()
        if pub is None:
            src._query(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(self.publication),
                sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in self.captured)),
                fetch=False)
            log.info("created publication %s for %s", self.publication, ", ".join(self.captured))
        elif not pub[0]:
            self.publish([t for t in self.captured if t in present or t == src.watermark_table])
        if self._slot() is None:
            src._query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot_name,))
            log.info("created logical replication slot %s (pgoutput)", self.slot_name)
        problems = self.problems()
        if problems:
            raise SourceSetupError(f"source {src.name!r}: " + "; ".join(map(str, problems)))

    def publish(self, tables) -> None:
        """Add those of ``tables`` the publication does not hold (by their names now)."""
        pub = self._publication()
        if pub is None or pub[0]:
            return
        published = self._published()
        missing = [t for t in tables if t not in published]
        for t in missing:   # one at a time: a table dropped since stops only itself
            try:
                self.source._query(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(self.publication), sql.Identifier(*t.split(".", 1))), fetch=False)
            except psycopg2.errors.UndefinedTable:
                log.warning("%s is gone from the catalog: not added to publication %s", t, self.publication)
                continue
            except psycopg2.errors.DuplicateObject:   # added meanwhile (a re-created table seen twice)
                continue
            log.info("added %s to publication %s", t, self.publication)

    def drop(self) -> None:
        """Drop the slot (its WAL is released) and the publication, if they exist."""
        src = self.source
        slot = self._slot()
        if slot is not None:
            if slot[4]:
                src._query("SELECT pg_terminate_backend(%s)", (slot[4],))
                time.sleep(0.2)
            src._query("SELECT pg_drop_replication_slot(%s)", (self.slot_name,))
        src._query(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.publication)),
                   fetch=False)
        uninstall_ddl_marks(src._query, src.namespace)

    def gap(self, resume_lsn: int) -> str | None:
        """Why the slot cannot stream from ``resume_lsn`` any more (``Source.log_gap``)."""
        slot = self._slot()
        if slot is None:
            return (f"replication slot {self.slot_name} of source {self.source.name!r} does not exist (dropped?): "
                    f"the WAL after the checkpoint {int_to_lsn(resume_lsn)} is not kept for this source any more")
        confirmed = slot[3]
        if confirmed is not None and lsn_to_int(confirmed) > resume_lsn:
            return (f"replication slot {self.slot_name} is confirmed up to {confirmed}, past the checkpoint "
                    f"{int_to_lsn(resume_lsn)} (advanced by another reader, or dropped and made again): the "
                    "changes in between are not streamed any more")
        return None

    def confirm(self, lsn: int) -> None:
        self.confirmed = max(self.confirmed, int(lsn))

    def await_free(self, start_lsn: int) -> None:
        """Return once the slot exists and no other reader holds it; else SourceSetupError.

        The caller holds the tail lease, so a dblog tail still streaming from the slot is
        one that lost it: dead (its walsender exits by itself) or paused (a zombie, whose
        walsender would hold the slot until wal_sender_timeout): its walsender is
        terminated. Another application's reader gets SLOT_RELEASE_WAIT_S to let go."""
        slot = self._slot()
        if slot is None:
            raise SourceSetupError(
                f"replication slot {self.slot_name} of source {self.source.name!r} does not exist: "
                f"the WAL after {int_to_lsn(start_lsn)} may be gone. Re-dump the tables and reset "
                "the tail's checkpoint (the tail creates the slot on its first run)")
        if slot[4] and self._is_dblog_tail(slot[4]):
            log.warning("replication slot %s is still streamed to process %s, a dblog tail that lost its "
                        "lease (dead or paused): terminating it", self.slot_name, slot[4])
            self.source._query("SELECT pg_terminate_backend(%s)", (slot[4],))
        deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
        while slot[4] and time.monotonic() < deadline:
            time.sleep(0.2)
            slot = self._slot() or slot
        if slot[4]:
            raise SourceSetupError(f"replication slot {self.slot_name} is in use by process "
                                   f"{slot[4]}: is another tail of this source running?")

    def _is_dblog_tail(self, pid: int) -> bool:
        rows = self.source._query("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,))
        return bool(rows) and rows[0][0] == TAIL_APPLICATION
