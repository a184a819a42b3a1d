"""PostgreSQL's change log read as a stream: a logical replication connection on the
source's slot (slot.py), pgoutput protocol version 1, each message decoded
(pgoutput.py) and fed to the transaction assembler (changes.py).

- Standby feedback confirms (flush LSN) only what the caller says is durable
  (``SlotAndPublication.confirm``, called by the tail after its checkpoint commit), so
  the slot never drops WAL that is not saved, and the WAL does not grow without bound.
  psycopg2 moves its flush LSN to a keepalive's wal_end by itself once everything
  received is confirmed (pqpath.c) and sends it with any feedback: so its own timer is
  off, and feedback goes out only once the checkpoint has reached every such wal_end
  (a TxnEnd with ``checkpoint_now`` first) — a tail killed then never finds the slot
  past its checkpoint (which would be a LogGapError).
- Between transactions, a keepalive's wal_end becomes a TxnEnd (the checkpoint follows
  WAL written by other tables); a quiet server gives Idle.
- A schema change's catalog read waits (VISIBLE_WAIT_S at most) until the transaction
  being decoded is visible: its commit is in the WAL before it is visible to snapshots.
- Values arrive as text and are parsed by the captured column's type
  (column_types.text_converter), giving the values select_keys reads.

Nothing here imports Airflow.
"""
from __future__ import annotations

import select
import time
from typing import Callable, Iterator

import psycopg2
import psycopg2.extras

from ...positions import Position
from ...values import pg_options
from ..base import Idle, LogItem, TxnEnd
from .changes import TransactionAssembler
from .lsn import int_to_lsn
from .pgoutput import decode
from .pgoutput_messages import Begin, Commit, Delete, Insert, Update
from .slot import TAIL_APPLICATION, SlotAndPublication

# the walsender prints values with these settings (pgoutput's text format): the same
# as every other session of the engine (values.PG_TEXT_SETTINGS)
REPLICATION_OPTIONS = pg_options()
FEEDBACK_EVERY_S = 5.0    # standby status also acts as the connection's keepalive
NO_TIMER_S = 86400.0      # psycopg2's own feedback timer: off (the module docstring)
VISIBLE_WAIT_S = 5.0      # a decoded ALTER's transaction awaited before its catalog read
BOUNDARY_EVERY_S = 0.2    # how often a keepalive's wal_end becomes a TxnEnd
CHECK_EVERY = 64          # messages between two stop tests inside a transaction
# how often, between transactions, the captured names' oids are compared with the catalog's: a
# table renamed away and created again shows nothing in the log until it is published
CATALOG_CHECK_EVERY_S = 2.0


class LogStream:
    """The reader of one PostgresSource's slot."""

    def __init__(self, source, slot: SlotAndPublication):
        self.source = source
        self.slot = slot

    def _connect(self):
        ep = self.source.config.endpoint
        return psycopg2.connect(host=ep.host, port=int(ep.port), user=ep.user,
                                password=ep.password or None, dbname=ep.database or None,
                                connect_timeout=10, application_name=TAIL_APPLICATION,
                                options=REPLICATION_OPTIONS,
                                connection_factory=psycopg2.extras.LogicalReplicationConnection)

    def read(self, start_lsn: int, should_stop: Callable[[], bool],
             idle_s: float) -> Iterator[LogItem]:
        """Row changes, watermark writes, transaction ends and Idle from ``start_lsn``
        until ``should_stop()``."""
        src, slot = self.source, self.slot
        slot.await_free(start_lsn)

        def refresh(table: str):
            # the transaction being decoded is committed in the WAL, maybe not yet visible
            if txns.in_txn:   # (VISIBLE_WAIT_S at most: the tail renews no lease meanwhile)
                src.await_visible(txns.xid, VISIBLE_WAIT_S)
            return src.refresh_schema(table), src.native_columns(table)
        txns = TransactionAssembler({t: src.table_schema(t) for t in src.tables},
                                    {t: src.native_columns(t) for t in src.tables},
                                    src.watermark_table,
                                    {t for t in src.tables if src.key_deferrable(t)},
                                    refresh=refresh, catalog=src)
        conn = self._connect()
        cur = conn.cursor()
        slot.confirm(start_lsn)
        sent = 0
        last_feedback = last_boundary = 0.0
        last_catalog = time.monotonic()
        last_idle = time.monotonic()
        last_end = start_lsn   # the highest TxnEnd position given so far
        # the highest wal_end psycopg2 may have moved its flush LSN to (a keepalive's, read
        # while every data message was confirmed): feedback waits until the checkpoint is there
        may_flush = start_lsn
        last_data = 0          # the start of the last data message (psycopg2's test)
        tick = 0               # messages until the next stop test and feedback look
        try:
            options = {"proto_version": "1", "publication_names": slot.publication}
            if conn.server_version >= 140000:   # the watermarks' shapes (log_marks.py)
                options["messages"] = "true"
            cur.start_replication(slot_name=slot.slot_name, decode=False, start_lsn=int(start_lsn),
                                  options=options, status_interval=NO_TIMER_S)
            while True:
                # the stop test and the feedback clock: after every commit and idle spell,
                # and every CHECK_EVERY messages inside a long transaction (not per message:
                # a row change costs a few microseconds, and they would be a fifth of it)
                if tick <= 0:
                    if should_stop():
                        # psycopg2 confirms a keepalive's wal_end for the slot by itself once
                        # everything received is confirmed (pqpath.c): a clean stop ends at
                        # that boundary too, so the next start never finds the slot past it
                        wal_end = int(cur.wal_end or 0)
                        if not txns.in_txn and wal_end > last_end:
                            yield TxnEnd(Position(0, wal_end, 0), {"lsn": int_to_lsn(wal_end)})
                        break
                    tick = CHECK_EVERY
                    now = time.monotonic()
                    if sent >= last_data:
                        may_flush = max(may_flush, int(cur.wal_end or 0))
                    if slot.confirmed > sent or now - last_feedback >= FEEDBACK_EVERY_S:
                        if slot.confirmed < may_flush and not txns.in_txn:
                            last_end = max(last_end, may_flush)   # (never a TxnEnd before the last)
                            yield TxnEnd(Position(0, last_end, 0), {"lsn": int_to_lsn(last_end)},
                                         checkpoint_now=True)
                        if slot.confirmed >= may_flush:   # (else: at the transaction's end)
                            cur.send_feedback(flush_lsn=slot.confirmed, force=True)
                            sent, last_feedback = slot.confirmed, now
                tick -= 1
                msg = cur.read_message()
                if msg is None:
                    tick = 0
                    now = time.monotonic()
                    # Every message before the last keepalive is read, and the server had
                    # decoded all the WAL before its wal_end: outside a transaction that is
                    # a clean boundary, so the checkpoint follows WAL written by other tables
                    wal_end = int(cur.wal_end or 0)
                    if not txns.in_txn and wal_end > last_end and now - last_boundary >= BOUNDARY_EVERY_S:
                        last_end, last_boundary = wal_end, now
                        yield TxnEnd(Position(0, wal_end, 0), {"lsn": int_to_lsn(wal_end)})
                    if not txns.in_txn and now - last_catalog >= CATALOG_CHECK_EVERY_S:
                        last_catalog = now
                        yield from txns.catalog_check(src.tables, Position(0, last_end, 0))
                    # Idle when the server is quiet, and at least every idle_s anyway: a
                    # stream of keepalives must not keep the caller from its own chores
                    if not select.select([cur], [], [], idle_s)[0] or now - last_idle >= idle_s:
                        last_idle = time.monotonic()
                        yield Idle()
                    continue
                last_data = msg.data_start
                m = decode(msg.payload)
                cls = m.__class__
                if cls is Insert or cls is Update or cls is Delete:   # the common case first
                    seen = txns.change(m)
                    if seen is not None:   # a watermark, or breaks of tables whose changes are skipped
                        yield from seen if seen.__class__ is list else (seen,)
                    elif len(txns.txn) >= txns.stream_after:
                        yield from txns.early()
                elif cls is Commit:
                    tick = 0
                    last_end = max(last_end, m.end_lsn)
                    yield from txns.commit(m)
                else:
                    if cls is Begin and slot.confirmed < may_flush:
                        # checkpointed before the transaction, so feedback may go out inside it
                        last_end = max(last_end, may_flush)
                        yield TxnEnd(Position(0, last_end, 0), {"lsn": int_to_lsn(last_end)},
                                     checkpoint_now=True)
                    yield from txns.other(m)
        finally:
            conn.close()
