"""The pgoutput decoder on real message bytes.

A module fixture captures pgoutput payloads from the private PostgreSQL (slot SQL
interface, ``pg_logical_slot_peek_binary_changes``), and the same checks run on the
bytes saved in ``tests/data/pgoutput_messages.json`` without any server. Set
``DBLOG_PGOUTPUT_RECAPTURE=1`` to rewrite that file from a fresh capture.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import struct
from decimal import Decimal
from pathlib import Path

import psycopg2
import pytest

from airflow_provider_dblog.engine.sources.postgres import relation_cache
from airflow_provider_dblog.engine.sources.postgres.lsn import int_to_lsn, lsn_to_int
from airflow_provider_dblog.engine.sources.postgres.pgoutput import decode
from airflow_provider_dblog.engine.sources.postgres.pgoutput_messages import (
    TRUNCATE_RESTART_IDENTITY, Begin, Commit, Delete, Insert, Message, Relation, RelationColumn,
    StreamAbort, StreamStart, StreamStop, Truncate, Type, Update)
from airflow_provider_dblog.engine.sources.postgres.relation_cache import UNCHANGED_TOAST, RelationCache
from airflow_provider_dblog.engine.sources.postgres.text_values import ARRAY_ELEMENT, convert

DATA = Path(__file__).parent / "data" / "pgoutput_messages.json"
UTC = dt.timezone.utc
BIG = "x" * 10000 + "end"       # STORAGE EXTERNAL: stored out of line, i.e. TOASTed

ROW1 = {
    "id": 1, "amount": Decimal("12345.67"), "note": 'héllo, "world"', "flag": True,
    "ts": dt.datetime(2024, 2, 29, 13, 14, 15, 123456),
    "tstz": dt.datetime(2024, 2, 29, 23, 59, 59, 1, tzinfo=UTC),
    "d": dt.date(2024, 2, 29), "doc": '{"a": [1, 2.5, null], "b": "x"}',
    "raw": b"\x00\x01\xffabc", "u": "6f1c2b3a-0000-4000-8000-00000000abcd",
    "ints": [1, 2, None], "tags": ["a b", 'c"d', "NULL", None, "x\\y", ""], "big": BIG,
}
ROW2 = {
    "id": 2, "amount": Decimal("NaN"), "note": None, "flag": False,
    "ts": dt.datetime(1999, 12, 31, 23, 59, 59),
    "tstz": dt.datetime(1969, 7, 20, 20, 17, 40, 500000, tzinfo=UTC),
    "d": None, "doc": None, "raw": b"", "u": None, "ints": [], "tags": None, "big": "small",
}
ROW1_NEW = dict(ROW1, note="changed", amount=Decimal("-0.05"), ints=[7], big=UNCHANGED_TOAST)
DEF1 = {"id": 10, "mood": "happy", "name": "first", "big": BIG}
DEF1_NEW = dict(DEF1, name="renamed", big=UNCHANGED_TOAST)
DEF2_NEW = dict(DEF1_NEW, id=11)

FULL_DDL = """CREATE TABLE t_full (id int8 PRIMARY KEY, amount numeric(12,2), note text,
  flag bool, ts timestamp(6), tstz timestamptz, d date, doc jsonb, raw bytea, u uuid,
  ints int4[], tags text[], big text);
ALTER TABLE t_full ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE t_def (id int8 PRIMARY KEY, mood mood, name text, big text);
ALTER TABLE t_def ALTER COLUMN big SET STORAGE EXTERNAL;"""

COLS = list(ROW1)
INSERT_FULL = (f"INSERT INTO t_full ({', '.join(COLS)}) VALUES "
               f"({', '.join('%(' + c + ')s' for c in COLS)})")


def _params(row):
    p = dict(row)
    p["raw"] = psycopg2.Binary(p["raw"])
    p["ints"] = psycopg2.extensions.AsIs("ARRAY[%s]::int4[]" % ",".join(
        "NULL" if v is None else str(v) for v in p["ints"]))
    return p


def _capture(dbname: str) -> dict:
    from helpers import pg_connect, unique
    slot, pub = unique("s"), unique("p")
    conn = pg_connect(dbname)
    try:
        with conn.cursor() as cur:
            cur.execute(FULL_DDL)
            cur.execute(f"CREATE PUBLICATION {pub} FOR TABLE t_full, t_def")
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            conn.autocommit = False
            with conn.cursor() as cur:      # tx 1: inserts and a logical message
                cur.execute(INSERT_FULL, _params(ROW1))
                cur.execute(INSERT_FULL, _params(ROW2))
                cur.execute("INSERT INTO t_def VALUES (10, 'happy', 'first', %s)", (BIG,))
                cur.execute("SELECT pg_logical_emit_message(true, 'dblog', 'hello')")
            conn.commit()
            with conn.cursor() as cur:      # tx 2: updates that leave `big` alone
                cur.execute("UPDATE t_full SET note='changed', amount=-0.05, ints='{7}' "
                            "WHERE id=1")
                cur.execute("UPDATE t_def SET name='renamed' WHERE id=10")
                cur.execute("UPDATE t_def SET id=11 WHERE id=10")
            conn.commit()
            with conn.cursor() as cur:      # tx 3: deletes
                cur.execute("DELETE FROM t_full WHERE id=2")
                cur.execute("DELETE FROM t_def WHERE id=11")
            conn.commit()
            with conn.cursor() as cur:      # tx 4: truncate
                cur.execute("TRUNCATE t_full, t_def RESTART IDENTITY")
            conn.commit()
            conn.autocommit = True
            with conn.cursor() as cur:
                # values are rendered by this session: a non-UTC zone with minutes
                cur.execute("SET TimeZone = 'Asia/Kolkata'")
                cur.execute("SELECT 't_full'::regclass::oid, 't_def'::regclass::oid, "
                            "'mood'::regtype::oid, current_setting('server_version_num')")
                full_oid, def_oid, mood_oid, version = cur.fetchone()
                cur.execute("SELECT lsn::text, xid::text::int8, data FROM "
                            "pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                            "'proto_version', '1', 'publication_names', %s, "
                            "'messages', 'true')", (slot, pub))
                rows = cur.fetchall()
        finally:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    finally:
        conn.close()
    return {
        "server_version_num": int(version),
        "oids": {"t_full": full_oid, "t_def": def_oid, "mood": mood_oid},
        "messages": [{"lsn": lsn, "xid": xid, "hex": bytes(data).hex(),
                      "kind": chr(bytes(data)[0])} for lsn, xid, data in rows],
    }


@pytest.fixture(scope="module")
def captured(servers):
    from helpers import pg_connect, unique
    name = unique("t")
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        cap = _capture(name)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    if os.environ.get("DBLOG_PGOUTPUT_RECAPTURE") == "1" or not DATA.exists():
        DATA.parent.mkdir(exist_ok=True)
        DATA.write_text(json.dumps(cap, indent=1) + "\n")
    return cap


def saved() -> dict:
    return json.loads(DATA.read_text())


# -- the checks, on captured or saved bytes ---------------------------------------------

def check_stream(cap: dict) -> None:
    oids = cap["oids"]
    msgs = [decode(bytes.fromhex(m["hex"])) for m in cap["messages"]]
    kinds = "".join(type(m).__name__[0] if not isinstance(m, Type) else "Y" for m in msgs)
    assert [m["kind"] for m in cap["messages"]] == [
        {"Relation": "R", "Type": "Y", "Insert": "I", "Update": "U", "Delete": "D",
         "Truncate": "T", "Message": "M", "Begin": "B", "Commit": "C"}[type(m).__name__]
        for m in msgs]
    # tx1: B R I I Y R I M C | tx2: B U U U C | tx3: B D D C | tx4: B R Y R T C
    # (TRUNCATE gives the tables new files: the relcache invalidation makes pgoutput
    # send the Relation (and Type) messages again, in the middle of the stream)
    assert kinds == "BRIIYRIMC" "BUUUC" "BDDC" "BRYRTC", kinds

    cache = RelationCache()
    txs, cur = [], None
    for raw, m in zip(cap["messages"], msgs):
        cache.add(m)
        if isinstance(m, Begin):
            assert m.xid == raw["xid"]
            assert m.commit_ts.tzinfo is UTC
            cur = [m]
        else:
            assert raw["xid"] == cur[0].xid
            cur.append(m)
        if isinstance(m, Commit):
            assert m.flags == 0
            assert m.commit_lsn == cur[0].final_lsn < m.end_lsn
            assert m.commit_ts == cur[0].commit_ts
            # the slot reports a commit at its end LSN (what to confirm as flushed)
            assert int_to_lsn(m.end_lsn) == raw["lsn"]
            txs.append(cur)
    assert [t[0].commit_ts for t in txs] == sorted(t[0].commit_ts for t in txs)
    assert [t[0].final_lsn for t in txs] == sorted(t[0].final_lsn for t in txs)

    schema = [m for m in msgs if isinstance(m, (Relation, Type))]
    assert schema[3:] == schema[:3]         # the re-sent ones are identical
    full, mood, deft = schema[:3]
    assert isinstance(full, Relation) and (full.oid, full.namespace, full.name) == (
        oids["t_full"], "public", "t_full")
    assert full.replica_identity == "f"
    assert [c.name for c in full.columns] == COLS
    assert all(c.is_key for c in full.columns)          # FULL: every column is the identity
    assert [c.type_oid for c in full.columns] == [20, 1700, 25, 16, 1114, 1184, 1082, 3802,
                                                  17, 2950, 1007, 1009, 25]
    amount = full.columns[1]
    assert ((amount.atttypmod - 4) >> 16, (amount.atttypmod - 4) & 0xFFFF) == (12, 2)
    assert full.columns[4].atttypmod == 6 and full.columns[2].atttypmod == -1
    assert isinstance(mood, Type) and (mood.oid, mood.namespace, mood.name) == (
        oids["mood"], "public", "mood")
    assert deft.replica_identity == "d" and deft.oid == oids["t_def"]
    assert [(c.name, c.is_key) for c in deft.columns] == [
        ("id", True), ("mood", False), ("name", False), ("big", False)]
    assert deft.columns[1].type_oid == oids["mood"]

    rc = [cache.tuple_change(m) for m in msgs if isinstance(m, (Insert, Update, Delete))]
    ins1, ins2, ins3, up1, up2, up3, del1, del2 = rc
    assert (ins1.op, ins1.relation.name, ins1.before) == ("insert", "t_full", None)
    assert ins1.after == ROW1
    assert type(ins1.after["amount"]) is Decimal and ins1.after["ts"].microsecond == 123456
    assert ins1.after["tstz"].utcoffset() == dt.timedelta(0)
    assert ins2.after.keys() == ROW2.keys() and ins2.after["amount"].is_nan()
    assert {k: v for k, v in ins2.after.items() if k != "amount"} == {
        k: v for k, v in ROW2.items() if k != "amount"}
    assert ins3.after == DEF1

    # REPLICA IDENTITY FULL: the whole old row (big detoasted), new big unchanged
    assert (up1.op, up1.before_is_key_only) == ("update", False)
    assert up1.before == ROW1
    assert up1.after == ROW1_NEW and up1.after["big"] is UNCHANGED_TOAST
    # DEFAULT, key kept: no old image at all
    assert (up2.before, up2.after) == (None, DEF1_NEW)
    # DEFAULT, key changed: the old key only
    assert (up3.before, up3.before_is_key_only, up3.after) == ({"id": 10}, True, DEF2_NEW)
    assert up3.after["big"] is UNCHANGED_TOAST

    assert (del1.op, del1.after) == ("delete", None) and del1.before["amount"].is_nan()
    assert dict(del1.before, amount=0) == dict(ROW2, amount=0)
    assert (del2.before, del2.before_is_key_only) == ({"id": 11}, True)
    raw_del2 = [m for m in msgs if isinstance(m, Delete)][1]
    assert raw_del2.old is None and [k for k, _ in raw_del2.key] == ["t", "n", "n", "n"]

    msg = next(m for m in msgs if isinstance(m, Message))
    assert (msg.transactional, msg.prefix, msg.content) == (True, "dblog", b"hello")
    assert 0 < msg.lsn <= txs[0][0].final_lsn

    trunc = msgs[-2]
    assert isinstance(trunc, Truncate)
    assert sorted(trunc.relation_oids) == sorted([oids["t_full"], oids["t_def"]])
    assert trunc.options == TRUNCATE_RESTART_IDENTITY

    # every real payload, cut anywhere, is a ValueError (never a struct.error / garbage)
    for m in cap["messages"]:
        data = bytes.fromhex(m["hex"])
        for cut in {1, 2, 5, len(data) // 2, len(data) - 1}:
            if 0 < cut < len(data):
                with pytest.raises(ValueError):
                    decode(data[:cut])


def test_live_capture_decodes(captured):
    check_stream(captured)


def test_saved_bytes_decode_offline():
    if not DATA.exists():
        pytest.skip("no saved capture yet (run the live test once)")
    check_stream(saved())


def test_array_type_oids_match_pg_type(servers):
    from helpers import pg_connect
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute("SELECT typarray::int, oid::int FROM pg_type WHERE oid = ANY(%s)",
                    (sorted(set(ARRAY_ELEMENT.values())),))
        assert dict(cur.fetchall()) == ARRAY_ELEMENT
    conn.close()


# -- decode: errors and synthetic messages -----------------------------------------------

def test_unknown_and_empty_messages():
    with pytest.raises(ValueError, match="unknown pgoutput message type 'Z'"):
        decode(b"Z\x00\x00")
    with pytest.raises(ValueError, match="empty"):
        decode(b"")
    with pytest.raises(ValueError, match="truncated"):
        decode(b"B" + b"\x00" * 10)
    with pytest.raises(ValueError, match="trailing"):
        decode(b"B" + b"\x00" * 21)
    bad_col = b"I" + struct.pack(">I", 5) + b"N" + struct.pack(">h", 1) + b"x"
    with pytest.raises(ValueError, match="tuple column kind"):
        decode(bad_col)


def test_origin_binary_column_and_stream_messages():
    o = decode(b"O" + struct.pack(">Q", 0x1_0000_0010) + b"node_a\0")
    assert (o.commit_lsn, o.name) == (0x1_0000_0010, "node_a")
    assert int_to_lsn(o.commit_lsn) == "1/10" and lsn_to_int("1/10") == o.commit_lsn
    ins = decode(b"I" + struct.pack(">I", 42) + b"N" + struct.pack(">h", 3)
                 + b"b" + struct.pack(">i", 4) + struct.pack(">i", 7) + b"u" + b"n")
    assert ins == Insert(42, [("b", b"\0\0\0\x07"), ("u", None), ("n", None)])
    # protocol 2: inside a stream, messages carry the streamed xid first
    ins2 = decode(b"I" + struct.pack(">I", 777) + struct.pack(">I", 42) + b"N"
                  + struct.pack(">h", 0), in_stream=True)
    assert (ins2.xid, ins2.relation_oid, ins2.new) == (777, 42, [])
    assert decode(b"S" + struct.pack(">IB", 777, 1)) == StreamStart(777, True)
    assert decode(b"E") == StreamStop()
    sc = decode(b"c" + struct.pack(">IBQQq", 777, 0, 100, 200, 86_400_000_000))
    assert sc.commit_ts == dt.datetime(2000, 1, 2, tzinfo=UTC) and sc.end_lsn == 200
    assert decode(b"A" + struct.pack(">II", 777, 778)) == StreamAbort(777, 778)


def test_relation_cache_errors():
    cache = RelationCache()
    with pytest.raises(KeyError, match="oid 9"):
        cache.tuple_change(Insert(9, []))
    cache.add(Relation(9, "s", "t", "d", [RelationColumn(1, "id", 20, -1)]))
    with pytest.raises(ValueError, match="2 columns"):
        cache.tuple_change(Insert(9, [("t", b"1"), ("t", b"2")]))
    assert cache.tuple_change(Insert(9, [("t", b"5")])).after == {"id": 5}
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST" and relation_cache._UnchangedToast() is UNCHANGED_TOAST


# -- convert ------------------------------------------------------------------------------

@pytest.mark.parametrize("oid,text,want", [
    (16, "t", True), (16, "f", False), (21, "-32768", -32768), (23, "7", 7),
    (20, "9223372036854775807", 2**63 - 1), (26, "4294967295", 4294967295),
    (700, "1.5", 1.5), (701, "-Infinity", float("-inf")),
    (1700, "0.10", Decimal("0.10")), (1700, "-123456789012345678901234.5",
                                      Decimal("-123456789012345678901234.5")),
    (1700, "Infinity", Decimal("Infinity")),
    (25, "a\\b", "a\\b"), (1043, "v", "v"), (1042, "ab  ", "ab  "), (19, "nm", "nm"),
    (17, "\\x00ff", b"\x00\xff"), (17, "\\x", b""),
    (1082, "0001-01-01", dt.date(1, 1, 1)), (1082, "infinity", dt.date.max),
    (1083, "12:34:56.5", "12:34:56.5"),
    (1114, "2024-01-02 03:04:05.5", dt.datetime(2024, 1, 2, 3, 4, 5, 500000)),
    (1114, "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
    (1184, "2024-01-02 03:04:05.000123+05:30",
     dt.datetime(2024, 1, 1, 21, 34, 5, 123, tzinfo=UTC)),
    (1184, "2024-01-02 03:04:05-08", dt.datetime(2024, 1, 2, 11, 4, 5, tzinfo=UTC)),
    (1184, "1900-01-01 00:00:00+05:53:28", dt.datetime(1899, 12, 31, 18, 6, 32, tzinfo=UTC)),
    (114, '{"a":1}', '{"a":1}'), (3802, '{"a": 1}', '{"a": 1}'),
    (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (1007, "{1,2,NULL}", [1, 2, None]), (1007, "{}", []),
    (1007, "[0:1]={5,6}", [5, 6]), (1007, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (1009, '{"a b","c\\"d",NULL,"NULL",x}', ["a b", 'c"d', None, "NULL", "x"]),
    (1231, "{1.50,NaN}", None), (1001, '{"\\\\x01ff"}', [b"\x01\xff"]),
    (1185, '{"2024-01-02 03:04:05+00"}', [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)]),
    (1000, "{t,f}", [True, False]), (3807, '{"{\\"a\\": 1}"}', ['{"a": 1}']),
    (1186, "1 day", "1 day"), (99999, "whatever", "whatever"), (23, None, None),
])
def test_convert(oid, text, want):
    got = convert(oid, text)
    if oid == 1231:
        assert got[0] == Decimal("1.50") and got[1].is_nan()
        return
    assert got == want and type(got) is type(want)


def test_convert_timestamptz_is_aware_utc_and_numeric_nan():
    v = convert(1184, "2024-06-01 00:00:00+02")
    assert v.tzinfo is UTC and v == dt.datetime(2024, 5, 31, 22, tzinfo=UTC)
    assert convert(1700, "NaN").is_nan()
    assert convert(1184, "infinity") == dt.datetime.max.replace(tzinfo=UTC)


@pytest.mark.parametrize("oid,text", [
    (16, "maybe"), (17, "abc"), (1082, "2024-01-02 BC"), (1114, "01/02/2024 03:04:05"),
    (1184, "2024-01-02 03:04:05"), (1007, "{1,2"), (1007, "{1,,2}"), (1007, "{1}x"),
    (23, "1.5"),
])
def test_convert_rejects(oid, text):
    with pytest.raises(ValueError):
        convert(oid, text)
