"""Trying to break the compiled binlog decoder (``decoder: mysql-event-stream``, issue 30)
on the real MariaDB: inputs the generated comparison (test_mes_decoder.py) does not draw,
and the reader's life cycle (stop, close, the server killing its connection).

A passing test is a behaviour that held; ``xfail(strict=True)`` marks a bug found (the
engine is not changed here): its reason says what goes wrong.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

import tempfile

import psutil
import pymysql
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.config import parse_config
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.sources.mysql.types import codec_of, prints_as, python_codec, set_members
from airflow_provider_dblog.engine.sources.base import Idle, RowChange, TxnEnd

from helpers import MARIADB_PORT, REDIS_PORT, mysql_connect, unique, wait_until

pytestmark = pytest.mark.usefixtures("servers")

MES, LIB = "mysql-event-stream", "mysql-replication"
POLL_THREAD = "dblog-binlog-poll"


def _raw(db: str, tables: list[str], root, **source) -> dict:
    return {"sources": {"s": {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                              "password": "", "tables": [f"{db}.{t}" for t in tables], "watermark_namespace": db,
                              "heartbeat_seconds": 0.1, "zero_dates": "refuse", **source}},
            "storage": {"root": str(root)}, "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0"}}


def _source(raw: dict, decoder: str):
    return open_source(parse_config({**raw, "sources": {"s": {**raw["sources"]["s"], "decoder": decoder}}}).sources["s"])


def _read(raw: dict, decoder: str, server_id: int, resume: dict, end: tuple) -> list:
    """Every item but Idle up to the TxnEnd at ``end`` (an event's error as a bool: the
    decoders' texts may differ)."""
    source = _source(raw, decoder)
    items, deadline = [], time.monotonic() + 30
    try:
        for item in source.read_log(resume, lambda: time.monotonic() > deadline, server_id):
            if isinstance(item, RowChange):
                items.append(item.event._replace(error=item.event.error is not None))
            elif isinstance(item, TxnEnd):
                items.append(("end", item.pos))
                if (item.pos.log, item.pos.offset) >= end:
                    return items
            elif not isinstance(item, Idle):
                items.append(item)
    finally:
        source.close()
    raise AssertionError(f"{decoder}: the log's end {end} was not reached in 30 s ({len(items)} items)")


def _master(cur) -> tuple[dict, tuple]:
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    return {"file": file, "pos": int(pos)}, (int(file.rsplit(".", 1)[1]), int(pos))


@contextmanager
def _history(creates: list[str], statements: list[str], setup: list[str] = ()):
    """Run ``creates`` then ``statements`` in a fresh database: (db, resume, end, cur), the
    database dropped after."""
    db = unique("mesbrk")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            cur.execute(f"USE `{db}`")
            cur.execute("SET SESSION sql_mode = ''")
            for s in [*setup, *creates]:
                cur.execute(s)
            resume, _ = _master(cur)
            for s in statements:
                cur.execute(s)
            _, end = _master(cur)
            yield db, resume, end, cur
        finally:
            cur.execute(f"DROP DATABASE `{db}`")


def _both(tmp_path, tables, creates, statements, setup=()) -> tuple[list, list]:
    with _history(creates, statements, setup) as (db, resume, end, _):
        raw = _raw(db, tables, tmp_path)
        return _read(raw, LIB, 7501, resume, end), _read(raw, MES, 7502, resume, end)


# -- what held ------------------------------------------------------------------------------
CHARSETS = ["ascii", "big5", "cp1250", "cp1251", "cp1256", "cp1257", "cp850", "cp852", "cp866", "cp932",
            "eucjpms", "euckr", "gb2312", "gbk", "greek", "hebrew", "koi8r", "koi8u", "latin1", "latin2",
            "latin5", "latin7", "macroman", "sjis", "tis620", "ucs2", "ujis", "utf16le", "utf8mb3", "utf8mb4"]
_MULTI = "aé中文한국€ßÿ日本語кириллица𝄞".encode().hex()
# (column type, its edge values): every width / precision / fsp the binlog encodes differently
SWEEP = [
    *[(f"BIT({n})", ["0", str(2 ** n - 1), str(2 ** (n - 1))]) for n in range(1, 65)],
    *[(f"DECIMAL({p},{s})", ["0", "-" + ("9" * (p - s) or "0") + ("." + "9" * s if s else ""),
                             ("9" * (p - s) or "0") + ("." + "9" * s if s else "")])
      for p, s in ((65, 0), (1, 1), (1, 0), (2, 1), (9, 9), (10, 0), (18, 9), (19, 0), (20, 10), (38, 0),
                   (39, 0), (40, 20), (65, 30), (30, 30), (65, 1))],
    *[(f"TIME({f})", ["'-838:59:59.999999'", "'838:59:59.999999'", "'-00:00:00.000001'"]) for f in range(7)],
    *[(f"DATETIME({f})", ["'1000-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'", "'2024-02-29 12:00:00.123456'"])
      for f in range(7)],
    *[(f"TIMESTAMP({f}) NULL", ["'1970-01-01 00:00:01'", "'2038-01-19 03:14:07.999999'", "'2000-01-01 00:00:00.000001'"])
      for f in range(7)],
    ("YEAR", ["0", "1901", "2155"]),
    ("ENUM(" + ",".join(f"'e{i}'" for i in range(300)) + ")", ["'e0'", "'e256'", "'e299'"]),
    ("SET(" + ",".join(f"'s{i}'" for i in range(63)) + ")", ["'s0'", "'s62'", "'" + ",".join(f"s{i}" for i in range(63)) + "'"]),
    ("JSON", ["'{\"é\": \"\\\\u00e9\\\\n\\\\\"𝄞\"}'", "'[1.5e300, -0.0, 18446744073709551615, 1e-7]'", "'\"\\\\u0000\"'"]),
    ("FLOAT(10,3) UNSIGNED", ["1.5", "0", "9999999.999"]),
    ("BIGINT(5) UNSIGNED ZEROFILL", ["18446744073709551615", "0", "42"]),
    *[(f"VARCHAR(30) CHARACTER SET {cs}", [f"CONVERT(_utf8mb4 0x{_MULTI} USING {cs})", "''", "NULL"]) for cs in CHARSETS],
]


def test_every_width_precision_fsp_and_charset_reads_alike(tmp_path):
    """BIT(1..64), DECIMAL of many (p, s), TIME / DATETIME / TIMESTAMP at fsp 0..6 and range
    ends, YEAR, ENUM of 300, SET of 63, JSON escapes and every character set the
    reader takes: the same items from both decoders (split over two tables: the row size)."""
    half = len(SWEEP) // 2
    parts = [SWEEP[:half], SWEEP[half:]]
    creates = [f"CREATE TABLE t{j} (id INT PRIMARY KEY, " + ", ".join(
        f"c{i} {t}" for i, (t, _) in enumerate(part)) + ") ROW_FORMAT=DYNAMIC" for j, part in enumerate(parts)]
    rows = [f"INSERT INTO t{j} VALUES " + ", ".join(
        f"({r}, {', '.join(v[r] for _, v in part)})" for r in range(3)) for j, part in enumerate(parts)]
    library, compiled = _both(tmp_path, ["t0", "t1"], creates,
                              ["SET time_zone = '+00:00'", "BEGIN", *rows, "UPDATE t0 SET c0 = 1 - c0", "COMMIT"])
    changes = [i for i in library if isinstance(i, tuple) and hasattr(i, "op")]
    assert len(changes) == 9 and not any(c.error for c in changes)
    assert compiled == library


def test_transactions_statements_and_shape_changes_read_alike(tmp_path):
    """SAVEPOINT / ROLLBACK TO, a transaction mixing captured and uncaptured tables (a
    multi-table UPDATE), MyISAM (its own COMMITs, a ROLLBACK logged for it), a table of 300
    columns, generated and INVISIBLE columns, a table dropped and created again under its
    name, TRUNCATE, ALTER TABLE, and a FLUSH BINARY LOGS rotation mid-history: the same items
    (SchemaChange, TableBroken, TableTruncated too) from both decoders."""
    creates = ["CREATE TABLE t (id INT PRIMARY KEY, a INT)", "CREATE TABLE x (id INT PRIMARY KEY, a INT)",
               "CREATE TABLE m (id INT PRIMARY KEY, a INT) ENGINE=MyISAM",
               "CREATE TABLE w (id INT PRIMARY KEY, " + ", ".join(f"c{i} INT" for i in range(300)) + ")",
               "CREATE TABLE g (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL, s INT AS (a + 1) STORED, "
               "h INT INVISIBLE DEFAULT 4)", "CREATE TABLE r (id INT PRIMARY KEY, a INT)"]
    statements = [
        "BEGIN", "INSERT INTO x VALUES (9, 9)", "INSERT INTO t VALUES (1, 1)", "SAVEPOINT `s 1`",
        "INSERT INTO t VALUES (2, 2)", "ROLLBACK TO SAVEPOINT `s 1`", "UPDATE t JOIN x SET t.a = 7, x.a = 7", "COMMIT",
        "INSERT INTO m VALUES (1, 1)", "UPDATE m SET a = 2",
        "BEGIN", "INSERT INTO t VALUES (3, 3)", "INSERT INTO m VALUES (2, 2)", "ROLLBACK",
        "INSERT INTO w (id, c0, c299) VALUES (1, 5, 7)", "UPDATE w SET c250 = 9", "DELETE FROM w",
        "INSERT INTO g (id, a) VALUES (1, 2)", "UPDATE g SET h = 9, a = 3",
        "INSERT INTO r VALUES (1, 2)", "DROP TABLE r", "CREATE TABLE r (id INT PRIMARY KEY, a INT)",
        "INSERT INTO r VALUES (2, 3)", "FLUSH BINARY LOGS", "TRUNCATE t", "INSERT INTO t VALUES (4, 4)",
        "ALTER TABLE t ADD COLUMN b INT DEFAULT 5", "INSERT INTO t VALUES (5, 5, 5)", "REPLACE INTO t VALUES (5, 6, 6)",
    ]
    library, compiled = _both(tmp_path, ["t", "m", "w", "g", "r"], creates, statements)
    kinds = {type(i).__name__ for i in library}
    assert {"Event", "TableBroken", "TableTruncated", "SchemaChange"} <= kinds, kinds
    assert compiled == library


def test_an_invalid_date_is_held_not_a_crash(tmp_path):
    """ALLOW_INVALID_DATES stores '2024-02-30': the compiled decoder holds the value (the
    row goes on, its error says why); mysql-replication raises ValueError ('day is out of
    range for month') out of read_log, stopping the tail (a bug of the other decoder)."""
    with _history(["CREATE TABLE t (id INT PRIMARY KEY, a DATETIME(2), b DATE)"],
                                       ["SET sql_mode = 'ALLOW_INVALID_DATES'",
                                        "INSERT INTO t VALUES (1, '2024-02-30 01:02:03.45', '2023-02-31')"]) as (db, resume, end, _):
        items = _read(_raw(db, ["t"], tmp_path), MES, 7503, resume, end)
    assert [(i.key, i.after, i.error) for i in items if hasattr(i, "op")] == [((1,), {"id": 1, "a": None, "b": None}, True)]


def _dumps(cur) -> dict[int, str]:
    """The server's Binlog Dump threads: id -> client host:port."""
    cur.execute("SELECT id, host FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%%'")
    return dict(cur.fetchall())


def _our_dumps(cur) -> set[int]:
    """The Binlog Dump threads whose client is a socket of this process (other sessions'
    readers are never touched)."""
    ports = {f"127.0.0.1:{c.laddr.port}" for c in psutil.Process().net_connections("tcp")
             if c.raddr and c.raddr.port == MARIADB_PORT}
    return {i for i, host in _dumps(cur).items() if host in ports}


def _polls() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == POLL_THREAD and t.is_alive()]


def test_stop_while_idle_is_prompt_and_close_leaves_nothing(tmp_path):
    """heartbeat_seconds 0.1: should_stop() turning True while idle ends the read within
    0.5 s; after it (and after a read abandoned mid-stream) no poll thread is alive and the
    server has no Binlog Dump connection of ours."""
    db = unique("mesbrk")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            cur.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
            source = _source(_raw(db, ["t"], tmp_path), MES)
            stop, idles, started = [False], 0, set()
            read = source.read_log(None, lambda: stop[0], 7504)
            for item in read:
                idles += isinstance(item, Idle)
                if idles == 3:
                    started = wait_until(lambda: _our_dumps(cur), 10, "our Binlog Dump on the server")
                    stop[0], t0 = True, time.monotonic()
            took = time.monotonic() - t0
            source.close()
            assert took < 0.5, took
            abandoned = source.read_log(None, lambda: False, 7505)
            assert any(isinstance(i, Idle) for i in abandoned)
            started |= _our_dumps(cur)
            abandoned.close()
            source.close()
            assert not _polls()
            writes = iter(range(1, 1000))

            def gone() -> bool:   # the server sees a closed dump socket when it next writes to it
                cur.execute(f"INSERT INTO `{db}`.t VALUES ({next(writes)})")
                return not (set(_dumps(cur)) & started)
            wait_until(gone, 5, "our Binlog Dump connections gone", poll=0.2)
        finally:
            cur.execute(f"DROP DATABASE `{db}`")


# -- bugs found -------------------------------------------------------------------------------
@pytest.mark.parametrize("spatial, text", [("POINT", "VARCHAR(30) CHARACTER SET utf8mb4"),
                                           ("LINESTRING", "TEXT CHARACTER SET latin1")])
def test_a_spatial_column_beside_a_text_column_reads_alike(tmp_path, spatial, text):
    """mysql-event-stream 1.8 refuses (ParseError) a rows event of a spatial column beside a text
    column; the reader decodes such an event with the library instead: the same items."""
    library, compiled = _both(tmp_path, ["t"], [f"CREATE TABLE t (id INT PRIMARY KEY, g {spatial}, s {text})"],
                              ["INSERT INTO t VALUES (1, ST_GeomFromText('POINT(1 2)'), 'a')" if spatial == "POINT"
                               else "INSERT INTO t VALUES (1, ST_GeomFromText('LINESTRING(0 0,1 1)'), 'a')"])
    assert [i.after["s"] for i in library if hasattr(i, "op")] == ["a"]
    assert compiled == library


def test_a_set_of_64_members_with_its_last_bit_reads_as_its_members(tmp_path):
    members = [f"s{i}" for i in range(64)]
    values = ["s63", ",".join(members), "s0,s62"]
    library, compiled = _both(
        tmp_path, ["t"], ["CREATE TABLE t (id INT PRIMARY KEY, c SET(" + ",".join(f"'{m}'" for m in members) + "))"],
        [f"INSERT INTO t VALUES ({i}, '{v}')" for i, v in enumerate(values)])
    assert [i.after["c"] for i in library if hasattr(i, "op")] == values   # the server's text
    assert compiled == library


# labels outside the BMP (information_schema and SHOW CREATE TABLE print each such character as
# '?'), one that really is '?', and two that differ only in which such character they hold (_bin)
WIDE = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
WIDE_LABELS = {"e": ("a", "\U0001d11e", "?", "x\U0001f600y?", "\U0001f600"),
               "s": ("p", "\U0001d11e", "?", "\U0001f600")}


def test_an_enum_label_outside_the_bmp_is_read(tmp_path):
    """The shape's labels are the true ones (catalog._true_labels: the server's own text of
    each label's number): the TABLE_MAP check passes and the compiled decoder's ENUM index and
    SET mask map to them. Before, every rows event of the table broke it, with either decoder."""
    library, compiled = _both(tmp_path, ["t"], ["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a', '\U0001d11e') "
                                                "CHARACTER SET utf8mb4)"], ["INSERT INTO t VALUES (1, '\U0001d11e')"])
    assert compiled == library
    assert [(type(i).__name__, getattr(i, "after", None)) for i in compiled if not isinstance(i, tuple) or hasattr(i, "op")] \
        == [("Event", {"id": 1, "e": "\U0001d11e"})]


def test_enum_and_set_labels_outside_the_bmp_and_a_real_question_mark_read_alike(tmp_path):
    enum, members = WIDE_LABELS["e"], WIDE_LABELS["s"]
    sets = ["\U0001d11e,?", "\U0001f600", "?", ",".join(members), ""]
    rows = [(i, enum[i % len(enum)], sets[i % len(sets)], "?" if i % 2 else "\U0001d11e")
            for i in range(len(enum) * 2)]
    quoted = lambda labels: ", ".join(f"'{v}'" for v in labels)   # noqa: E731
    library, compiled = _both(
        tmp_path, ["t"], [f"CREATE TABLE t (id INT PRIMARY KEY, e ENUM({quoted(enum)}) {WIDE}, "
                          f"s SET({quoted(members)}) {WIDE}, g ENUM('?', '\U0001d11e') CHARACTER SET utf8mb4)"],
        ["INSERT INTO t VALUES " + ", ".join(f"({i}, '{e}', '{s}', '{g}')" for i, e, s, g in rows),
         "UPDATE t SET e = '?', s = '\U0001d11e', g = '?' WHERE id = 1",   # before images too
         "DELETE FROM t WHERE id = 3"])
    assert compiled == library
    assert [type(i).__name__ for i in library if type(i) is not tuple] == ["Event"] * (len(rows) + 2), library
    changes = [i for i in library if hasattr(i, "op")]
    assert [tuple(c.after.values()) for c in changes[:len(rows)]] == rows   # exactly the labels written
    assert changes[-2].before == dict(zip(("id", "e", "s", "g"), rows[1])) and \
        changes[-2].after == {"id": 1, "e": "?", "s": "\U0001d11e", "g": "?"}
    assert changes[-1].before == dict(zip(("id", "e", "s", "g"), rows[3])) and not any(c.error for c in changes)


# characters an ENUM / SET label may hold (no ',' for SET members, no trailing space: MariaDB
# strips it), each drawn only for character sets that have it
_LABEL_CHARS = "aZ0_-'\u00e9\u00df\u00ff\u00c1\u20ac\u043a\u4e2d\ud55c\u65e5\U0001d11e\u0394\u05d0\u0e01"


@st.composite
def _labelled(draw) -> tuple[str, list[str]]:
    """A character set and distinct labels in it: short ones, and long ones (128 bytes and
    more: their length takes more than one byte in the TABLE_MAP)."""
    charset = draw(st.sampled_from(CHARSETS))
    alphabet = [c for c in _LABEL_CHARS if _encodes(c, charset)]
    label = st.one_of(st.text(alphabet, min_size=1, max_size=6),
                      st.tuples(st.text(alphabet, min_size=1, max_size=3), st.integers(43, 255)).map(
                          lambda tn: (tn[0] * 255)[:tn[1]]))
    return charset, draw(st.lists(label, min_size=1, max_size=5, unique_by=str.casefold))


def _encodes(c: str, charset: str) -> bool:
    """Whether Python's codec of ``charset`` has ``c`` (the server's own table, where it was
    loaded, only decodes: Python's codec of the name then)."""
    if ord(c) > 0xFFFF and charset in ("utf8mb3", "ucs2"):
        return False
    for codec in (codec_of(charset), python_codec(charset)):
        try:
            return c.encode(codec).decode(codec) == c
        except (UnicodeError, ValueError, LookupError):
            continue
    return False


@settings(max_examples=int(os.environ.get("LABEL_EXAMPLES", 30)), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(_labelled())
def test_enum_and_set_labels_of_any_character_set_are_read_as_written(drawn):
    """Generated: an ENUM and a SET column in a drawn character set with drawn labels (any
    character the set has, long labels too). The TABLE_MAP carries the labels in the column's
    character set (mysql-replication decodes them as UTF-8 and misreads lengths over 127:
    logged_labels.py reads them): both decoders carry each row's label exactly, before and
    after images, and break no table."""
    charset, labels = drawn
    quoted = ", ".join("'" + lab.replace("'", "''") + "'" for lab in labels)
    creates = [f"CREATE TABLE t (id INT PRIMARY KEY, e ENUM({quoted}) CHARACTER SET {charset}, "
               f"s SET({quoted}) CHARACTER SET {charset})"]
    try:
        with _history(creates, [f"INSERT INTO t VALUES ({i}, {i + 1}, {1 << i})" for i in range(len(labels))]
                      + [f"UPDATE t SET e = NULL, s = {(1 << len(labels)) - 1} WHERE id = 0"]) \
                as (db, resume, end, cur):
            cur.execute("SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = 't' AND COLUMN_NAME = 'e'", (db,))
            printed = set_members(cur.fetchone()[0])   # a character the server's set lacks became '?'
            assume(len(printed) == len(labels) and all(map(prints_as, labels, printed)))
            raw = _raw(db, ["t"], tempfile.mkdtemp())
            library, compiled = _read(raw, LIB, 7501, resume, end), _read(raw, MES, 7502, resume, end)
    except pymysql.err.OperationalError as e:   # labels equal under the column's collation
        assume(e.args[0] != 1291)
        raise
    assert compiled == library
    changes = [i for i in library if type(i) is not tuple]
    assert all(type(c).__name__ == "Event" and not c.error for c in changes), changes
    assert [(c.after["e"], c.after["s"]) for c in changes[:-1]] == [(lab, lab) for lab in labels]
    assert changes[-1].before == {"id": 0, "e": labels[0], "s": labels[0]}
    assert changes[-1].after == {"id": 0, "e": None, "s": ",".join(labels)}


@pytest.mark.parametrize("decoder", [MES, LIB])
@pytest.mark.parametrize("image", ["MINIMAL", "NOBLOB"])
def test_a_sessions_partial_row_image_breaks_its_table_by_name(tmp_path, decoder, image):
    """A session's binlog_row_image=MINIMAL/NOBLOB (the source check reads only the GLOBAL
    value) logs partial rows: neither decoder may carry them (the library read the missing
    columns as NULL, the compiled one raised a bare DecodeError). The table breaks, naming
    binlog_row_image, its partial rows are skipped, and the tail reads on: the full ones after
    are carried (the table is held until a re-dump)."""
    with _history(["CREATE TABLE t (id INT PRIMARY KEY, a INT, b BLOB)"],
                  ["INSERT INTO t VALUES (1, 2, 'x')", f"SET SESSION binlog_row_image = {image}",
                   "UPDATE t SET a = 5", "DELETE FROM t", "SET SESSION binlog_row_image = FULL",
                   "INSERT INTO t VALUES (2, 3, 'y')"]) as (db, resume, end, _):
        items = _read(_raw(db, ["t"], tmp_path), decoder, 7506, resume, end)
    broken = [i for i in items if type(i).__name__ == "TableBroken"]
    assert len(broken) == 1 and "binlog_row_image" in broken[0].why, items
    assert [(i.op, i.key) for i in items if hasattr(i, "op")] == [("insert", (1,)), ("insert", (2,))]


def test_the_server_killing_the_stream_is_a_transient_error(tmp_path):
    """KILL of the reader's Binlog Dump thread: a ConnectionError, which the tail retries from
    its checkpoint (the client reports it as a plain MesError, code 403)."""
    db = unique("mesbrk")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            cur.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
            source = _source(_raw(db, ["t"], tmp_path), MES)
            read, deadline, killed = source.read_log(None, lambda: time.monotonic() > deadline, 7507), \
                time.monotonic() + 30, False
            try:
                for item in read:
                    if isinstance(item, Idle) and not killed:
                        cur.execute(f"KILL {wait_until(lambda: _our_dumps(cur), 10, 'our Binlog Dump').pop()}")
                        killed, deadline = True, time.monotonic() + 10
                raise AssertionError("the killed stream gave no error in 10 s")
            except Exception as e:   # noqa: BLE001 - whatever it is, it must be transient
                error = e
            finally:
                read.close()
                source.close()
        finally:
            cur.execute(f"DROP DATABASE `{db}`")
    assert source.is_transient(error), f"{type(error).__name__}: {error}"


def _in_poll_batch(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "poll_batch":
            return True
        frame = frame.f_back
    return False


def test_a_stop_with_the_batch_queue_full_is_prompt_and_ends_the_poll_thread(tmp_path):
    db = unique("mesbrk")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        polling = None
        try:
            cur.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
            cur.execute(f"CREATE TABLE `{db}`.x (id INT PRIMARY KEY)")
            source = _source(_raw(db, ["t"], tmp_path), MES)
            source.read_timeout_s = 4      # the join's wait: max(5 s, this)
            stop = [False]
            read = source.read_log(None, lambda: stop[0], 7508)
            assert isinstance(next(read), Idle)       # caught up; the reader now paused here
            polling = read.gi_yieldfrom.gi_frame.f_locals["polling"]
            deadline, n = time.monotonic() + 20, 0
            while not (polling.out.full() and _in_poll_batch(polling)):   # a batch per insert
                assert time.monotonic() < deadline, "the queue did not fill"
                if not polling.out.full():
                    size, n = polling.out.qsize(), n + 1
                    cur.execute(f"INSERT INTO `{db}`.x VALUES ({n})")
                    wait_until(lambda: polling.out.qsize() > size, 5, "the insert's batch queued", poll=0.01)
                time.sleep(0.01)
            stop[0], t0 = True, time.monotonic()
            assert list(read) == []
            took = time.monotonic() - t0
            source.close()
            # well inside the join's wait (5 s) the bug waited out, with room for a loaded machine
            assert took < 2.5 and not polling.is_alive(), (took, polling.is_alive())
        finally:
            if polling is not None:   # let a stuck thread's put() through, so it ends
                stop[0] = True
                read.close()
                source.close()
                deadline = time.monotonic() + 30
                while polling.is_alive() and time.monotonic() < deadline:
                    while not polling.out.empty():
                        polling.out.get_nowait()
                    polling.join(0.1)
            cur.execute(f"DROP DATABASE `{db}`")
