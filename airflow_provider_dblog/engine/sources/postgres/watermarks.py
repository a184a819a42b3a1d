"""The watermark table of a PostgreSQL source and the writes of its watermarks: each
one a single-row UPDATE in its own short transaction (with a logical message of the
captured tables' shapes before it, no lock taken), returning only once every transaction already in the log is
visible to new snapshots (``_await_logged_commits``).

Nothing here imports Airflow.
"""
from __future__ import annotations

import time

import psycopg2
from psycopg2 import sql

from ...errors import WatermarkError
from ..sql_source import WATERMARK_TABLE
from .catalog import SHAPES_SQL
from .log_marks import SHAPES_PREFIX
from .sql import table_ident, table_stmt


class WatermarkWrites:
    """PostgresSource's watermark table and writes (a mixin: it queries through the source)."""

    def ensure_watermark_table(self) -> None:
        wm = table_ident(self.watermark_table)
        self._query(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.namespace)),
                    fetch=False)
        self._query(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id smallint PRIMARY KEY, "
                            "value text NOT NULL, updated_at timestamptz)").format(wm), fetch=False)
        ident = self._query(
            "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (self.namespace, WATERMARK_TABLE))
        if ident and ident[0][0] != "f":  # (ALTER takes a short exclusive lock: only once)
            self._query(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(wm), fetch=False)
        self._query(sql.SQL("INSERT INTO {} (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING")
                    .format(wm), fetch=False)

    def write_watermark(self, value: str) -> None:
        """One single-row UPDATE, the only row change of its transaction, which also carries
        the captured tables' shapes into the log (``_with_shapes``)."""
        if not isinstance(value, str) or not value or len(value) > 36:
            raise ValueError(f"a watermark is a UUID string of at most 36 characters, not {value!r}")
        query = table_stmt("UPDATE ", self.watermark_table, " SET value = %s, updated_at = now() WHERE id = 1")
        with self._wm_lock:
            self._wm_conn = self._alive(self._wm_conn)
            with self._wm_conn.cursor() as cur:
                n = self._with_shapes(cur, query, value)
                if n is None:   # the shapes could not be had: the watermark alone
                    cur.execute(query, (value,))
                    n = cur.rowcount
                if n == 1:
                    self._await_logged_commits(cur)
        if n != 1:
            raise WatermarkError(f"watermark row of {self.watermark_table} is missing "
                                 "(run ensure_watermark_table)")

    def _emit_shapes(self, cur) -> None:
        cur.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND (n.nspname || '.' || c.relname) = ANY(%s)",
                    (list(self.tables),))
        present = [r[0] for r in cur.fetchall()]
        cur.execute(f"SELECT pg_logical_emit_message(true, %s, ({SHAPES_SQL}))", (SHAPES_PREFIX, present))

    def mark_shapes(self) -> None:
        """The captured tables' shapes into the log alone (a logical message in its own short
        transaction, no row written). A dump reads its log head after it (chunk_plan.py): a
        table renamed or altered with no row written since is a version below that head, so
        that dump releases what the change fixed (quarantine.releasing_dump)."""
        with self._wm_lock:
            self._wm_conn = self._alive(self._wm_conn)
            with self._wm_conn.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    self._emit_shapes(cur)
                    cur.execute("COMMIT")
                except psycopg2.Error:
                    if cur.connection.closed:
                        raise
                    cur.execute("ROLLBACK")   # (a table gone meanwhile: its watermarks tell)

    def _with_shapes(self, cur, query, value: str) -> int | None:
        """The watermark written after a logical message of the captured tables' shapes, in
        one short transaction (no lock taken: DESIGN invariant 4). A table that ALTERed with
        no row written since has no Relation message there yet; the tail learns its shape
        from this (log_marks.py), so a chunk is in the log's shape at its HW. A change
        committed between the shapes' read and the watermark is not mistaken for the table's
        shape there: the tail takes a carried shape only when the catalog still has it.
        None: not written (a table gone meanwhile)."""
        cur.execute("BEGIN")
        try:
            self._emit_shapes(cur)
            cur.execute(query, (value,))
            n = cur.rowcount
            cur.execute("COMMIT")
            return n
        except psycopg2.Error:
            if cur.connection.closed:
                raise
            cur.execute("ROLLBACK")
            return None

    visible_timeout_s = 120.0   # how long a logged commit may stay invisible (see below)

    def _await_logged_commits(self, cur) -> None:
        """Wait until every transaction whose commit is in the WAL is visible.

        PostgreSQL writes a transaction's commit record, marks it committed, and only then
        makes it visible to new snapshots; a synchronous standby's acknowledgement comes in
        between. A transaction in that gap is in the log before this watermark, yet a chunk
        select after the watermark would not see it: its old row would be emitted at the HW,
        over the newer log event (tests/integration/test_invariants.py). So after a
        watermark, no transaction of this database may be committed and still running: none
        waiting for a synchronous standby (pg_stat_activity's ``SyncRep`` wait; seeing other
        users' sessions needs pg_read_all_stats, which ``check`` asks for), none committed
        in the commit log while still in the snapshot's running set. Fails closed after
        ``visible_timeout_s``."""
        deadline = time.monotonic() + self.visible_timeout_s
        while True:
            cur.execute(
                "SELECT array_agg(DISTINCT x) FROM ("
                " SELECT backend_xid::text AS x FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                " AND datname = current_database() AND backend_xid IS NOT NULL UNION ALL "
                " SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
                " WHERE pg_xact_status(x) = 'committed') AS logged")
            (pending,), = cur.fetchall()
            if not pending:
                return
            if time.monotonic() > deadline:
                raise WatermarkError(
                    f"source {self.name!r}: transaction(s) {', '.join(pending[:5])} committed in the "
                    f"log but still not visible after {self.visible_timeout_s:.0f}s (a synchronous "
                    "standby that does not answer?): a chunk select would not see them. Fix the "
                    "standby (synchronous_standby_names), then resume the dump")
            time.sleep(0.005)

    def await_visible(self, xid: int, timeout_s: float) -> None:
        """Wait until transaction ``xid``, whose commit the tail has read in the log, is visible
        to new snapshots: a catalog read before it would miss what it changed (an ALTER with
        rows in one transaction, read as the catalog being past the log: a false quarantine).
        After ``timeout_s`` the catalog is read anyway (it then decides, as before)."""
        deadline = time.monotonic() + timeout_s
        while True:
            (xmax,), = self._query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
            xmax = int(xmax)   # the 32-bit xid as a full one: the nearest to xmax (within 2^31)
            full = xmax + ((int(xid) - xmax + 2**31) % 2**32 - 2**31)
            (seen,), = self._query("SELECT pg_visible_in_snapshot(%s::text::xid8, pg_current_snapshot())", (full,))
            if seen or time.monotonic() > deadline:
                return
            time.sleep(0.005)
