"""PostgresSource.read_log against the private PostgreSQL 15: a real replication
slot read with pgoutput. Values equal what select_keys reads, unchanged TOAST
values are filled from the old row, positions follow commit order, the slot
keeps the WAL until the tail confirms it, and whatever would be silently wrong
(TRUNCATE, ALTER TABLE, no old row, a missing slot) stops with a clear error."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from airflow_provider_dblog.engine.config import Endpoint, SourceConfig
from airflow_provider_dblog.engine.errors import SourceSetupError
from airflow_provider_dblog.engine.events import DELETE, INSERT, UPDATE, rows_of
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.sources.base import Idle, RowChange, SchemaChange, TableBroken, TableTruncated, TxnEnd
from airflow_provider_dblog.engine.sources.postgres import lsn_to_int

from helpers import POSTGRES_PORT, pg_connect, unique


@pytest.fixture
def db(pg_db):
    conn = pg_connect(pg_db)
    with conn.cursor() as cur:
        cur.execute("CREATE SCHEMA app")
    yield pg_db, conn
    conn.close()


def run(conn, text, args=None):
    with conn.cursor() as cur:
        cur.execute(text, args)
        return cur.fetchall() if cur.description else None


def make(pg_db, tables, **kw):
    cfg = SourceConfig(name="pg", kind="postgres",
                       endpoint=Endpoint("127.0.0.1", POSTGRES_PORT, "postgres", "", pg_db),
                       tables=tuple(tables), watermark_namespace="dblog",
                       slot=kw.pop("slot", unique("slot")), publication=unique("pub"), **kw)
    return open_source(cfg)


def create(conn, name, columns, full=True):
    run(conn, f"CREATE TABLE app.{name} ({columns})")
    if full:
        run(conn, f"ALTER TABLE app.{name} REPLICA IDENTITY FULL")


def read(src, resume, until=None, seconds=20.0):
    """Items (Idle left out) until ``until(items)`` holds, or the log head is reached."""
    head, _ = src.current_resume()
    items, t0 = [], time.monotonic()

    def done():
        if until is not None:
            return until(items)
        return any(isinstance(i, TxnEnd) and i.pos >= head for i in items)
    for item in src.read_log(resume, lambda: done() or time.monotonic() - t0 > seconds):
        if not isinstance(item, Idle):
            items.append(item)
    assert done(), f"the log did not reach what the test waited for in {seconds}s: {items[-3:]}"
    return items


def changes(items):
    return [i.event for i in items if isinstance(i, RowChange)]


def started(src):
    src.prepare_log()
    return src.current_resume()[1]


TYPES = """id int PRIMARY KEY, i2 smallint, i8 bigint, n numeric(12,3), nu numeric, f4 real,
    f8 double precision, b bool, t text, vc varchar(10), ch char(5), u uuid, d date, ts timestamp,
    tz timestamptz, j json, jb jsonb, by bytea, ia int[], ta text[], iv interval, tm time,
    mood app.mood, dom app.posint"""


def test_log_values_equal_what_select_keys_reads(db):
    pg_db, conn = db
    run(conn, "CREATE TYPE app.mood AS ENUM ('sad', 'happy')")
    run(conn, "CREATE DOMAIN app.posint AS int CHECK (VALUE > 0)")
    create(conn, "types", TYPES)
    src = make(pg_db, ["app.types"])
    resume = started(src)
    run(conn, """INSERT INTO app.types VALUES
        (1, -32768, 9223372036854775807, -123456789.125, 1e-30, 1.5, 0.1, true, 'a''b\\c é', 'xyz',
         'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '2024-01-02 03:04:05.123456',
         '2024-01-02 03:04:05.5+05:30', '{"b": 1,  "a": [1, 2]}', '{"b": 1,  "a": [1, 2]}',
         '\\x00ff27', '{1,NULL,3}', '{"a b",NULL,"c,d"}', '1 day 02:03:04', '23:59:59.999999',
         'happy', 7),
        (2, NULL, NULL, NULL, 'NaN', 'NaN', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, '{}', NULL, NULL, NULL, NULL, NULL)""")
    events = changes(read(src, resume))
    schema = src.table_schema("app.types")
    assert [e.op for e in events] == [INSERT, INSERT]
    want = rows_of(schema, src.select_keys(schema, [(1,), (2,)]))
    got = [e.after for e in events]
    nan_free = [{k: v for k, v in r.items() if k not in ("f4", "f8", "nu")} for r in got]
    assert nan_free == [{k: v for k, v in r.items() if k not in ("f4", "f8", "nu")} for r in want]
    assert got[0]["f4"] == want[0]["f4"] and got[0]["f8"] == want[0]["f8"] == 0.1
    assert got[1]["nu"] == want[1]["nu"] == "NaN" and got[1]["f8"] == float("-inf")
    assert got[0]["tz"].isoformat() == "2024-01-01T21:34:05.500000"  # UTC, naive
    assert got[0]["by"] == b"\x00\xff'" and got[0]["ia"] == "{1,NULL,3}"


def test_unchanged_toast_value_is_taken_from_the_old_row(db):
    pg_db, conn = db
    create(conn, "docs", "id int PRIMARY KEY, v int, body text")
    src = make(pg_db, ["app.docs"])
    resume = started(src)
    # random hex does not compress below the TOAST threshold: stored out of line
    run(conn, "INSERT INTO app.docs SELECT 1, 0, string_agg(md5(random()::text), '') "
              "FROM generate_series(1, 3000)")
    (toast,), = run(conn, "SELECT reltoastrelid::regclass::text FROM pg_class "
                          "WHERE oid = 'app.docs'::regclass")
    assert run(conn, f"SELECT count(*) > 0 FROM {toast}") == [(True,)]  # stored out of line
    run(conn, "UPDATE app.docs SET v = 1 WHERE id = 1")  # body unchanged: pgoutput omits it
    (body,), = run(conn, "SELECT body FROM app.docs")
    ins, upd = changes(read(src, resume))
    assert upd.op == UPDATE and len(body) == 96_000
    assert upd.after["body"] == body and upd.before["body"] == body and upd.after["v"] == 1


def test_a_table_without_the_old_row_breaks_there_and_the_others_flow(db):
    """REPLICA IDENTITY not FULL (refused by `dblog check`, or set while the tail runs): its
    changes lack the old row, so the table breaks at its Relation and its changes are
    skipped; another table's flow on (before, the tail stopped for every table)."""
    pg_db, conn = db
    create(conn, "docs", "id int PRIMARY KEY, v int, body text", full=False)  # DEFAULT identity
    create(conn, "other", "id int PRIMARY KEY")
    src = make(pg_db, ["app.docs", "app.other"])
    assert any("REPLICA IDENTITY is DEFAULT" in p.what for p in src.check())
    resume = started(src)
    run(conn, "INSERT INTO app.docs SELECT 1, 0, string_agg(md5(random()::text), '') "
              "FROM generate_series(1, 3000)")
    run(conn, "UPDATE app.docs SET v = 1 WHERE id = 1")
    run(conn, "INSERT INTO app.other VALUES (1)")
    items = read(src, resume)
    (broken,) = [i for i in items if isinstance(i, TableBroken)]
    assert broken.table == "app.docs" and "REPLICA IDENTITY FULL" in broken.why
    assert [(e.table, e.key) for e in changes(items)] == [("app.other", (1,))]


def test_primary_key_change_is_a_delete_then_an_insert(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY, v text")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    run(conn, "INSERT INTO app.t VALUES (1, 'a')")
    run(conn, "UPDATE app.t SET id = 2, v = 'b' WHERE id = 1")
    _, delete, insert = changes(read(src, resume))
    assert (delete.op, delete.key, delete.before) == (DELETE, (1,), {"id": 1, "v": "a"})
    assert (insert.op, insert.key, insert.after) == (INSERT, (2,), {"id": 2, "v": "b"})
    assert delete.pos.offset == insert.pos.offset and insert.pos.seq == delete.pos.seq + 1


def test_positions_follow_commit_order_not_change_order(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY, v int")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    other = pg_connect(pg_db)
    try:
        with other.cursor() as late:
            late.execute("BEGIN")
            late.execute("INSERT INTO app.t VALUES (1, 1)")  # written first, committed last
            run(conn, "INSERT INTO app.t VALUES (2, 2)")
            late.execute("INSERT INTO app.t VALUES (3, 3)")
            late.execute("COMMIT")
    finally:
        other.close()
    items = read(src, resume)
    events = changes(items)
    assert [e.key for e in events] == [(2,), (1,), (3,)]
    positions = [i.event.pos if isinstance(i, RowChange) else i.pos for i in items]
    assert positions == sorted(positions)   # the stream is in position order
    assert events[1].pos.offset == events[2].pos.offset and events[2].pos.seq == 1
    ends = [i for i in items if isinstance(i, TxnEnd)]
    assert all(e.pos > ev.pos for e in ends for ev in events if ev.pos.offset < e.pos.offset)


def test_watermarks_are_seen_in_their_transaction(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    run(conn, "INSERT INTO app.t VALUES (1)")
    src.write_watermark("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    run(conn, "INSERT INTO app.t VALUES (2)")
    items = [i for i in read(src, resume) if not isinstance(i, TxnEnd)]
    assert [type(i).__name__ for i in items] == ["RowChange", "WatermarkSeen", "RowChange"]
    assert items[1].value == "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    assert items[0].event.pos < items[1].pos < items[2].event.pos


def test_truncate_of_a_captured_table_is_a_step_at_its_point_and_reading_goes_on(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    create(conn, "other", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    run(conn, "INSERT INTO app.t VALUES (1)")
    run(conn, "TRUNCATE app.t, app.other")
    run(conn, "INSERT INTO app.t VALUES (2)")
    items = read(src, resume)
    (truncated,) = [i for i in items if isinstance(i, TableTruncated)]   # not the uncaptured table
    assert truncated.table == "app.t"
    first, second = changes(items)
    assert first.pos < truncated.pos < second.pos and second.key == (2,)


def test_a_truncate_drops_the_changes_held_for_netting_before_it(db):
    """Under a DEFERRABLE key a transaction's changes are held to its commit and numbered
    past its other positions: an insert before a TRUNCATE would then land after it and
    bring its row back. The TRUNCATE drops them (their rows are gone)."""
    pg_db, conn = db
    create(conn, "d", "id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED")
    src = make(pg_db, ["app.d"])
    resume = started(src)
    run(conn, "BEGIN; INSERT INTO app.d VALUES (1); UPDATE app.d SET id = 3 WHERE id = 1; TRUNCATE app.d; "
              "INSERT INTO app.d VALUES (2); COMMIT")
    items = read(src, resume)
    (truncated,) = [i for i in items if isinstance(i, TableTruncated)]
    after = [e for e in changes(items) if e.pos > truncated.pos]
    assert [e.key for e in changes(items)] == [(2,)] and after == changes(items)


def test_a_changed_relation_is_a_schema_change(db):
    """A Relation message that differs: the reader reads the table's shape again, gives out
    SchemaChange at the next change, and decodes the rows after it with the new shape."""
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY, v int")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    src.table_schema("app.t")  # the schema the tail captures with
    run(conn, "INSERT INTO app.t VALUES (1, 1)")
    run(conn, "ALTER TABLE app.t ADD COLUMN w text")
    run(conn, "INSERT INTO app.t VALUES (2, 2, 'x')")
    items = []
    deadline = time.monotonic() + 30
    log = src.read_log(resume, lambda: time.monotonic() > deadline)
    for item in log:
        items.append(item)
        if len(changes(items)) == 2:
            break
    run(conn, "ALTER TABLE app.t ALTER COLUMN v TYPE bigint")   # after the reader passed the first
    run(conn, "INSERT INTO app.t VALUES (3, 3, 'y')")
    for item in log:
        items.append(item)
        if len(changes(items)) == 3:
            break
    log.close()
    rows = changes(items)
    schema_changes = [i for i in items if isinstance(i, SchemaChange)]
    assert [e.after for e in rows] == [{"id": 1, "v": 1}, {"id": 2, "v": 2, "w": "x"}, {"id": 3, "v": 3, "w": "y"}]
    assert [c.pos for c in schema_changes] == [rows[1].pos, rows[2].pos]
    assert src.table_schema("app.t").column("v").type == "int64"


def test_a_catalog_past_the_log_breaks_only_that_table_and_reading_goes_on(db):
    """Read from before two ALTERs, the catalog already has both: the first changed Relation
    does not match it. Rather than misread the rows, the reader breaks the table there
    (TableBroken), gives out the catalog's shape, skips its changes, and reads them again
    once a Relation matches."""
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY, v int")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    src.table_schema("app.t")
    run(conn, "INSERT INTO app.t VALUES (1, 1)")
    run(conn, "ALTER TABLE app.t ADD COLUMN w text")
    run(conn, "INSERT INTO app.t VALUES (2, 2, 'x')")
    run(conn, "ALTER TABLE app.t ADD COLUMN z text")
    run(conn, "INSERT INTO app.t VALUES (3, 3, 'x', 'y')")
    items = read(src, resume, until=lambda items: any(e.key == (3,) for e in changes(items)))
    (broken,) = [i for i in items if isinstance(i, TableBroken)]
    assert broken.table == "app.t" and "catalog is past" in broken.why
    assert [e.key for e in changes(items)] == [(1,), (3,)]      # 2 skipped: its shape is no longer known
    (shape,) = [i for i in items if isinstance(i, SchemaChange)]
    assert shape.pos == broken.pos


def test_slot_keeps_the_wal_until_the_tail_confirms_it(db):
    """The slot's confirmed_flush_lsn (before which a restart skips commits) never passes
    a commit the tail has not confirmed as durable; it moves once the tail confirms."""
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    resume = started(src)

    def confirmed():
        (lsn,), = run(conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                            "WHERE slot_name = %s", (src.config.slot,))
        return lsn_to_int(lsn)
    for i in range(5):
        run(conn, "INSERT INTO app.t VALUES (%s)", (i,))
    def replied_since(t) -> bool:
        # the server has a standby status reply (the reader's feedback) newer than t
        (ok,), = run(conn, "SELECT coalesce(bool_or(r.reply_time > %s), false) FROM pg_stat_replication r "
                           "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
                     (t, src.config.slot))
        return ok

    items, t0, seen_at, confirming = [], time.monotonic(), None, False
    stop = threading.Event()
    for item in src.read_log(resume, lambda: stop.is_set() or time.monotonic() - t0 > 60):
        items.append(item)
        events, ends = changes(items), [i for i in items if isinstance(i, TxnEnd)]
        if len(events) == 5 and seen_at is None:
            (seen_at,), = run(conn, "SELECT now()")
        if seen_at is not None and not confirming and replied_since(seen_at):
            # the reader kept going and sent its feedback after all 5 commits: it confirmed none
            assert confirmed() <= events[0].pos.offset   # a restart would re-read every commit
            src.confirm(ends[2].resume)   # the tail made everything before the 3rd end durable
            confirming = True
        if confirming and confirmed() >= ends[2].pos.offset:
            stop.set()
    assert confirming, "the reader sent no feedback after the commits within 60s"
    assert stop.is_set(), "the slot did not move within 60s of the confirmation"
    assert ends[2].pos.offset <= confirmed() <= events[3].pos.offset
    # a restart from that checkpoint reads the rest exactly once
    rest = changes(read(src, ends[2].resume))
    assert [e.key for e in rest] == [(3,), (4,)]


def test_idle_log_gives_a_boundary_at_the_head(db):
    """Writes to tables outside the publication still move the checkpoint to the head
    (keepalives), so a drain does not wait for the next captured change."""
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    create(conn, "other", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    run(conn, "INSERT INTO app.other SELECT generate_series(1, 1000)")
    items = read(src, resume, seconds=60)
    assert not changes(items)


def test_missing_slot_fails_closed(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    resume = started(src)
    src.drop_log()
    with pytest.raises(SourceSetupError, match="does not exist: the WAL .* may be gone"):
        list(src.read_log(resume, lambda: False))


def test_prepare_creates_and_checks_slot_and_publication(db):
    pg_db, conn = db
    create(conn, "t", "id int PRIMARY KEY")
    create(conn, "u", "id int PRIMARY KEY")
    src = make(pg_db, ["app.t"])
    src.prepare_log()
    pub = src.config.publication
    published = {r[0] for r in run(conn, "SELECT schemaname || '.' || tablename FROM "
                                         "pg_publication_tables WHERE pubname = %s", (pub,))}
    assert published == {"app.t", "dblog.watermark"}
    assert run(conn, "SELECT plugin FROM pg_replication_slots WHERE slot_name = %s",
               (src.config.slot,)) == [("pgoutput",)]
    # a table added to the config is added to the publication
    wider = open_source(dataclasses.replace(src.config, tables=("app.t", "app.u")))
    wider.prepare_log()
    assert len(run(conn, "SELECT 1 FROM pg_publication_tables WHERE pubname = %s", (pub,))) == 3
    assert wider.check() == []
    # what the engine cannot fix is reported by check() and stops prepare_log()
    run(conn, f"ALTER PUBLICATION {pub} SET (publish = 'insert, update')")
    run(conn, f"ALTER PUBLICATION {pub} SET TABLE app.t WHERE (id > 10), app.u (id), dblog.watermark")
    whats = " | ".join(p.what for p in wider.check())
    assert "does not publish delete, truncate" in whats and "filters the rows of app.t" in whats
    assert "publishes only the columns ['id'] of app.u (a column list)" in whats
    with pytest.raises(SourceSetupError, match="does not publish"):
        wider.prepare_log()
    taken = make(pg_db, ["app.t"], slot=unique("other"))
    run(conn, "SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (taken.config.slot,))
    assert any("not a logical pgoutput slot" in p.what for p in taken.check())
    with pytest.raises(SourceSetupError, match="slot name"):
        make(pg_db, ["app.t"], slot="Bad-Name").check_or_raise()
