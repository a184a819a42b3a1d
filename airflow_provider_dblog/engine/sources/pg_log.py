"""PostgreSQL's change log: a logical replication slot read with pgoutput.

- The publication holds the captured tables and the watermark table; the slot
  (plugin pgoutput) keeps the WAL from the last confirmed position on. Both are
  created when missing (``prepare``) and checked when present.
- The stream arrives in commit order. A change's position is (0, commit LSN,
  index within the transaction): Begin carries the commit LSN (final_lsn), so
  positions are known as the changes arrive. A transaction ends (TxnEnd) at its
  Commit's end LSN, which is where a restart resumes: the server skips every
  transaction whose commit record starts before it.
- Standby feedback confirms (flush LSN) only what the caller says is durable
  (``confirm``, called by the tail after its checkpoint commit), so the slot
  never drops WAL that is not saved, and the WAL does not grow without bound.
- Values arrive as text and are parsed by the captured column's type
  (postgres.from_text), giving the values select_keys reads.
- Fail closed: a Relation message that differs from the captured schema, a
  TRUNCATE of a captured table, an UPDATE/DELETE without the full old row, an
  unchanged TOAST value with no old row to take it from.

Nothing here imports Airflow.
"""
from __future__ import annotations

import logging
import operator
import re
import select
import time
from typing import TYPE_CHECKING, Callable, Iterator

import psycopg2
import psycopg2.extras
from psycopg2 import sql

from ..errors import DBLogError, SchemaChangedError, SourceSetupError, UncarriedValueError
from ..events import DELETE, INSERT, UPDATE, Event
from ..netting import needs_netting, net_changes
from ..positions import Position
from ..values import pg_options
from .base import Idle, LogItem, Problem, RowChange, TxnEnd, WatermarkSeen
from .pgoutput import (Begin, Commit, Delete, Insert, Relation, StreamAbort, StreamCommit,
                       StreamStart, StreamStop, Truncate, Update, decode)

if TYPE_CHECKING:
    from .postgres import PostgresSource

log = logging.getLogger(__name__)

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
# the walsender prints values with these settings (pgoutput's text format): the same
# as every other session of the engine (values.PG_TEXT_SETTINGS)
REPLICATION_OPTIONS = pg_options()
FEEDBACK_EVERY_S = 5.0
SLOT_RELEASE_WAIT_S = 15.0
BOUNDARY_EVERY_S = 0.2    # how often a keepalive's wal_end becomes a TxnEnd   # standby status also acts as the connection's keepalive
CHECK_EVERY = 64         # messages between two stop tests inside a transaction
ACTIONS = ("pubinsert", "pubupdate", "pubdelete", "pubtruncate")


def check_slot_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _SLOT_NAME.match(name):
        raise SourceSetupError(f"{what} {name!r} must be 1-63 characters of a-z, 0-9 and _")
    return name


def _ms(ts) -> int:
    return int(ts.timestamp() * 1000)


class PgLog:
    """The slot and publication of one PostgresSource, and the reader of its stream."""

    def __init__(self, source: "PostgresSource"):
        self.source = source
        cfg = source.config
        self.slot = check_slot_name(cfg.slot or f"dblog_{cfg.name}".lower(), "slot name")
        self.publication = check_slot_name(cfg.publication or f"dblog_{cfg.name}".lower(),
                                           "publication name")
        self.captured = tuple(source.tables) + (source.watermark_table,)
        self._confirmed = 0   # the highest LSN the caller said is durable

    # -- publication and slot ----------------------------------------------------
    def _publication(self) -> tuple | None:
        rows = self.source._query(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication "
            "WHERE pubname = %s", (self.publication,))
        return rows[0] if rows else None

    def _published(self) -> dict[str, tuple]:
        """{schema.table: (column names published, row filter)} of the publication."""
        rows = self.source._query(
            "SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables "
            "WHERE pubname = %s", (self.publication,))
        return {f"{s}.{t}": (tuple(a or ()), f) for s, t, a, f in rows}

    def _slot(self) -> tuple | None:
        rows = self.source._query(
            "SELECT plugin, slot_type, database, confirmed_flush_lsn::text, active_pid "
            "FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
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
            for table in self.captured:
                if table not in published:
                    continue   # prepare() adds it
                cols, rowfilter = published[table]
                if rowfilter:
                    out.append(Problem(
                        f"publication {self.publication} filters the rows of {table} "
                        f"(WHERE {rowfilter}): changes would be lost",
                        f"ALTER PUBLICATION {self.publication} SET TABLE ... without a WHERE", table))
                if table in self.source.tables:
                    want = self.source.table_schema(table).column_names
                    if set(cols) != set(want):
                        out.append(Problem(
                            f"publication {self.publication} publishes only the columns "
                            f"{list(cols)} of {table}", "publish every column (no column list)",
                            table))
        slot = self._slot()
        if slot is not None:
            plugin, kind, database, _, _ = slot
            if kind != "logical" or plugin != "pgoutput":
                out.append(Problem(f"replication slot {self.slot} is a {kind} slot of plugin "
                                   f"{plugin}, not a logical pgoutput slot",
                                   "set another `slot:` for this source, or drop that slot"))
            elif database != self.source.config.endpoint.database:
                out.append(Problem(f"replication slot {self.slot} belongs to database {database}",
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
        for table in src.tables:
            src.table_schema(table)   # unknown tables / no primary key: fail here
        pub = self._publication()
        if pub is None:
            src._query(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(self.publication),
                sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in self.captured)),
                fetch=False)
            log.info("created publication %s for %s", self.publication, ", ".join(self.captured))
        elif not pub[0]:
            missing = [t for t in self.captured if t not in self._published()]
            if missing:
                src._query(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(self.publication),
                    sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in missing)),
                    fetch=False)
                log.info("added %s to publication %s", ", ".join(missing), self.publication)
        if self._slot() is None:
            src._query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
            log.info("created logical replication slot %s (pgoutput)", self.slot)
        problems = self.problems()
        if problems:
            raise SourceSetupError(f"source {src.name!r}: " + "; ".join(map(str, problems)))

    def drop(self) -> None:
        """Drop the slot (its WAL is released) and the publication, if they exist."""
        src = self.source
        slot = self._slot()
        if slot is not None:
            if slot[4]:
                src._query("SELECT pg_terminate_backend(%s)", (slot[4],))
                time.sleep(0.2)
            src._query("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        src._query(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.publication)),
                   fetch=False)

    def confirm(self, lsn: int) -> None:
        self._confirmed = max(self._confirmed, int(lsn))

    # -- the stream --------------------------------------------------------------
    def _connect(self):
        ep = self.source.config.endpoint
        return psycopg2.connect(host=ep.host, port=int(ep.port), user=ep.user,
                                password=ep.password or None, dbname=ep.database or None,
                                connect_timeout=10, application_name="dblog-tail",
                                options=REPLICATION_OPTIONS,
                                connection_factory=psycopg2.extras.LogicalReplicationConnection)

    def read(self, start_lsn: int, should_stop: Callable[[], bool],
             idle_s: float) -> Iterator[LogItem]:
        from .postgres import int_to_lsn, text_converter
        src = self.source
        slot = self._slot()
        if slot is None:
            raise SourceSetupError(
                f"replication slot {self.slot} of source {src.name!r} does not exist: the WAL "
                f"after {int_to_lsn(start_lsn)} may be gone. Re-dump the tables and reset the "
                "tail's checkpoint (the tail creates the slot on its first run)")
        deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
        while slot[4] and time.monotonic() < deadline:  # a killed reader's walsender exiting
            time.sleep(0.2)
            slot = self._slot() or slot
        if slot[4]:
            raise SourceSetupError(f"replication slot {self.slot} is in use by process {slot[4]}: "
                                   "is another tail of this source running?")
        schemas = {t: src.table_schema(t) for t in src.tables}
        natives = {t: src.native_columns(t) for t in src.tables}
        # oid -> (captured table, Relation, column converters, key getter)
        relations: dict[int, tuple] = {}
        wm_table = src.watermark_table
        conn = self._connect()
        cur = conn.cursor()
        self.confirm(start_lsn)
        sent = 0
        last_feedback = last_boundary = 0.0
        last_idle = time.monotonic()
        in_txn = False
        commit_lsn, seq, ts = 0, 0, 0
        # the open transaction's row changes (given out at its commit), the keys it touched,
        # and whether one was touched twice (engine/netting.py)
        txn: list[Event] = []
        touched: set = set()
        shared = False
        last_end = start_lsn   # the highest TxnEnd position given so far
        tick = 0               # messages until the next stop test and feedback look
        try:
            cur.start_replication(slot_name=self.slot, decode=False, start_lsn=int(start_lsn),
                                  options={"proto_version": "1",
                                           "publication_names": self.publication})
            while True:
                # the stop test and the feedback clock: after every commit and idle spell,
                # and every CHECK_EVERY messages inside a long transaction (not per message:
                # a row change costs a few microseconds, and they would be a fifth of it)
                if tick <= 0:
                    if should_stop():
                        break
                    tick = CHECK_EVERY
                    now = time.monotonic()
                    if self._confirmed > sent or now - last_feedback >= FEEDBACK_EVERY_S:
                        cur.send_feedback(flush_lsn=self._confirmed, force=True)
                        sent, last_feedback = self._confirmed, now
                tick -= 1
                msg = cur.read_message()
                if msg is None:
                    tick = 0
                    now = time.monotonic()
                    # Every message before the last keepalive is read, and the server had
                    # decoded all the WAL before its wal_end: outside a transaction that is
                    # a clean boundary, so the checkpoint follows WAL written by other tables
                    wal_end = int(cur.wal_end or 0)
                    if not in_txn and wal_end > last_end and now - last_boundary >= BOUNDARY_EVERY_S:
                        last_end, last_boundary = wal_end, now
                        yield TxnEnd(Position(0, wal_end, 0), {"lsn": int_to_lsn(wal_end)})
                    # Idle when the server is quiet, and at least every idle_s anyway: a
                    # stream of keepalives must not keep the caller from its own chores
                    if not select.select([cur], [], [], idle_s)[0] or now - last_idle >= idle_s:
                        last_idle = time.monotonic()
                        yield Idle()
                    continue
                m = decode(msg.payload)
                cls = m.__class__
                if cls is Insert or cls is Update or cls is Delete:   # the common case first
                    entry = relations.get(m.relation_oid)
                    if entry is None:
                        continue   # a table we do not capture (a shared publication)
                    table, rel, convs, key_of = entry
                    if table == wm_table:
                        if cls is not Delete:
                            value = _tuple_text(rel, m.new).get("value") or ""
                            yield WatermarkSeen(value.strip(), Position(0, commit_lsn, seq))
                            seq += 1
                        continue
                    if cls is Insert:
                        errs: list = []
                        after = _row(m.new, rel, convs, None, schemas[table], commit_lsn, errs)
                        key, why, _ = _keyed(schemas[table], key_of, after, errs)
                        txn.append(Event(table, INSERT, key, None, after,
                                         Position(0, commit_lsn, seq), ts, why))
                        shared = shared or needs_netting(touched, table, key)
                        seq += 1
                        continue
                    for op, key, before, after, why in _old_new(m, rel, convs, schemas[table],
                                                                key_of, commit_lsn):
                        txn.append(Event(table, op, key, before, after,
                                         Position(0, commit_lsn, seq), ts, why))
                        shared = shared or needs_netting(touched, table, key)
                        seq += 1
                elif cls is Begin:
                    in_txn, commit_lsn, seq, ts = True, m.final_lsn, 0, _ms(m.commit_ts)
                    txn, touched, shared = [], set(), False
                elif cls is Commit:
                    if not in_txn or m.commit_lsn != commit_lsn:
                        raise DBLogError(f"pgoutput Commit at {int_to_lsn(m.commit_lsn)} does not "
                                         "match its Begin; restart from the last checkpoint")
                    in_txn = False
                    tick = 0
                    last_end = max(last_end, m.end_lsn)
                    # a key touched twice may have held two rows at once (a DEFERRABLE key):
                    # then the transaction's changes go out as one final change per key
                    for e in (net_changes(txn) if shared else txn):
                        yield RowChange(e)
                    txn = []
                    yield TxnEnd(Position(0, m.end_lsn, 0), {"lsn": int_to_lsn(m.end_lsn)})
                elif cls is Relation:
                    table = f"{m.namespace}.{m.name}"
                    if table in schemas:
                        self._check_relation(m, schemas[table], natives[table])
                        # each column's text converter, built once per Relation message
                        convs = [text_converter(natives[table][c.name]) for c in m.columns]
                        relations[m.oid] = (table, m, convs, _key_getter(schemas[table]))
                    elif table == wm_table:
                        relations[m.oid] = (table, m, [], None)
                elif cls is Truncate:
                    hit = [relations[o][0] for o in m.relation_oids
                           if o in relations and relations[o][0] in schemas]
                    if hit:
                        err = SchemaChangedError(
                            f"TRUNCATE of {', '.join(hit)} at LSN {int_to_lsn(commit_lsn)}: its rows "
                            "were removed without row events; re-dump the table (and move the log "
                            "checkpoint past this transaction)")
                        err.tables, err.pos = hit, Position(0, commit_lsn, seq)
                        raise err
                elif cls in (StreamStart, StreamStop, StreamCommit, StreamAbort):
                    raise DBLogError("pgoutput sent a streamed transaction, which protocol "
                                     "version 1 does not use")
                # Origin, Type, Message: nothing to capture
        finally:
            conn.close()

    @staticmethod
    def _check_relation(rel: Relation, schema, native: dict) -> None:
        names = [c.name for c in rel.columns]
        problem = ""
        if names != schema.column_names:
            problem = f"the log has columns {names}, the captured schema {schema.column_names}"
        else:
            changed = [c.name for c in rel.columns
                       if native[c.name].att_type_oid and c.type_oid != native[c.name].att_type_oid]
            if changed:
                problem = f"the type of {', '.join(changed)} changed"
        if problem:
            raise SchemaChangedError(
                f"{schema.qualified} changed (ALTER TABLE?): {problem}; update the capture's "
                "schema (restart the tail) and re-dump the table")

def _tuple_text(rel: Relation, tup) -> dict[str, str | None]:
    return {c.name: (None if raw is None else raw.decode("utf-8"))
            for c, (kind, raw) in zip(rel.columns, tup)}


def _key_getter(schema) -> Callable[[dict], tuple]:
    """``schema.key_of`` as one C call (itemgetter): it runs for every row image."""
    if len(schema.key) == 1:
        name = schema.key[0]
        return lambda row: (row[name],)
    return operator.itemgetter(*schema.key)


UNCARRIED_KEY = "!uncarried:"   # as in sources/mysql.py: a key value no target can hold


def _row(tup, rel: Relation, convs: list, old: dict | None, schema, commit_lsn: int,
         errs: list) -> dict:
    """One tuple's values, each parsed by its column's converter (postgres.text_converter);
    an unchanged TOAST value (kind 'u') is taken from ``old``, the full old row. A value
    no target can hold becomes None and is named in ``errs`` as (column, raw text, why)."""
    out = {}
    for col, conv, (kind, raw) in zip(rel.columns, convs, tup):
        try:
            if kind == "t":   # the common case first: a text value
                out[col.name] = conv(raw.decode("utf-8"))
                continue
        except UncarriedValueError as e:
            errs.append((col.name, raw.decode("utf-8"), str(e)))
            out[col.name] = None
            continue
        except (TypeError, ValueError) as e:
            raise SchemaChangedError(
                f"{schema.qualified}.{col.name}: {e}; the column's type changed (ALTER "
                "TABLE?): update the capture's schema and re-dump the table") from None
        if kind == "n":
            out[col.name] = None
        elif kind == "u":   # unchanged TOAST: not sent, take it from the old row
            if old is None:
                raise SchemaChangedError(
                    f"{schema.qualified}.{col.name}: an UPDATE at LSN {_lsn(commit_lsn)} "
                    "kept a TOASTed value that the log does not carry and no full old row "
                    f"was logged: ALTER TABLE {schema.qualified} REPLICA IDENTITY FULL, "
                    "then re-dump the table")
            out[col.name] = old[col.name]
        else:
            raise DBLogError(f"pgoutput sent a value of kind {kind!r} (binary?); the tail "
                             "reads text values")
    return out


def _keyed(schema, key_of, row: dict, errs: list) -> tuple[tuple, str | None, bool]:
    """(key, why, key_bad) of a row image: ``why`` names its values that could not be
    carried, and a key column among them is named by its raw text in the key."""
    if not errs:
        return key_of(row), None, False
    why = "; ".join(f"{schema.qualified}.{c}: {e}" for c, _, e in errs)
    bad = {c: raw for c, raw, _ in errs}
    key_bad = any(k in bad for k in schema.key)
    key = tuple(f"{UNCARRIED_KEY}{bad[k]!r}" if k in bad else row[k] for k in schema.key)
    return key, why, key_bad


def _old_new(m, rel: Relation, convs: list, schema, key_of, commit_lsn: int) -> tuple:
    """(op, key, before, after, error) for an Update or Delete message: one, or a delete
    and an insert when the update changed the key. Both need the full old row."""
    if m.old is None:
        raise SourceSetupError(
            f"an {'UPDATE' if isinstance(m, Update) else 'DELETE'} of {schema.qualified} at LSN "
            f"{_lsn(commit_lsn)} carries no full old row: ALTER TABLE {schema.qualified} "
            "REPLICA IDENTITY FULL, then re-dump the table")
    eb: list = []
    before = _row(m.old, rel, convs, None, schema, commit_lsn, eb)
    kb, wb, kb_bad = _keyed(schema, key_of, before, eb)
    if m.__class__ is Delete:
        return ((DELETE, kb, before, None, wb if kb_bad else None),)
    ea: list = []
    after = _row(m.new, rel, convs, before, schema, commit_lsn, ea)
    ka, wa, _ = _keyed(schema, key_of, after, ea)
    if kb == ka:
        return ((UPDATE, kb, before, after, wa),)
    return ((DELETE, kb, before, None, wb if kb_bad else None), (INSERT, ka, None, after, wa))


def _lsn(value: int) -> str:
    from .postgres import int_to_lsn
    return int_to_lsn(value)
