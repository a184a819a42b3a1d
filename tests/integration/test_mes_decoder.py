"""The compiled binlog decoder (``decoder: mysql-event-stream``) against the library one
(``mysql-replication``), on generated histories (issue 30).

Hypothesis draws a table (a key and columns of the MariaDB types dblog carries, in several
character sets) and a history of transactions of multi-row INSERTs, UPDATEs (key changes
among them) and DELETEs of random values: edge values, zero dates, bytes no charset
decodes, NULLs. The history runs on the real MariaDB; then the same binlog range is read
by ``MySQLSource.read_log`` once per decoder, and the two must give the same items: every
row change (table, op, key, both images, position, time) and every transaction end. A value
one decoder holds (``Event.error``) the other must hold too (their texts may differ).

Together with the type-fidelity matrix (which checks the default decoder's values against
the server's own text), this makes the two interchangeable for every value drawn here.
"""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.config import parse_config
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.sources.base import RowChange, TxnEnd

from helpers import MARIADB_PORT, REDIS_PORT, mysql_connect, unique

pytestmark = pytest.mark.usefixtures("servers")


def _hex(b: bytes) -> str:
    return f"0x{b.hex()}" if b else "''"


def _ints(bits: int, unsigned: bool):
    lo, hi = (0, 2 ** bits - 1) if unsigned else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    return st.one_of(st.sampled_from([lo, hi, 0, 1]), st.integers(lo, hi)).map(str)


def _text(charset: str):
    """Any characters (the server converts, '?' for what its charset lacks), or raw bytes."""
    chars = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
    converted = chars.map(lambda s: f"CONVERT(_utf8mb4 {_hex(s.encode())} USING {charset})")
    if charset not in ("latin1", "cp1250"):   # the server refuses bytes invalid in a multi-byte charset
        return converted
    return st.one_of(converted, st.binary(max_size=8).map(lambda b: f"_{charset} {_hex(b)}" if b else "''"))


def _date():
    return st.one_of(st.sampled_from(["0000-00-00", "2024-00-10", "1000-01-01", "9999-12-31"]),
                     st.dates().map(str)).map(lambda d: f"'{d}'")


def _time(fsp: int):
    def text(us: int) -> str:
        sign, us = ("-" if us < 0 else ""), abs(us)
        s, frac = divmod(us, 1_000_000)
        return f"'{sign}{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}.{frac:06d}'"
    return st.integers(-(838 * 3600 + 3599) * 10 ** 6, (838 * 3600 + 3599) * 10 ** 6).map(text)


def _datetime(fsp: int, low: int, high: int):
    import datetime as dt
    return st.one_of(st.just("'0000-00-00 00:00:00'"), st.integers(low, high).map(
        lambda us: "'" + (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)).isoformat(" ") + "'"))


_DT_RANGE = (-30610224000 * 10 ** 6, 253402300799 * 10 ** 6)       # 1000-01-01 .. 9999-12-31
_TS_RANGE = (1 * 10 ** 6, 2147483647 * 10 ** 6)                     # TIMESTAMP's own range
# (column type, strategy of SQL literals): what dblog carries from MariaDB
TYPES = [
    *[(f"{t}{' UNSIGNED' if u else ''}", _ints(b, u)) for t, b in
      (("TINYINT", 8), ("SMALLINT", 16), ("MEDIUMINT", 24), ("INT", 32), ("BIGINT", 64)) for u in (False, True)],
    ("DECIMAL(65,30)", st.decimals(allow_nan=False, allow_infinity=False, places=30,
                                   min_value=-10 ** 34, max_value=10 ** 34).map(str)),
    ("DECIMAL(10,2)", st.decimals(allow_nan=False, allow_infinity=False, places=2,
                                  min_value=-10 ** 7, max_value=10 ** 7).map(str)),
    ("FLOAT", st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr)),
    ("DOUBLE", st.floats(allow_nan=False, allow_infinity=False).map(repr)),
    ("BIT(1)", st.integers(0, 1).map(str)), ("BIT(13)", st.integers(0, 2 ** 13 - 1).map(str)),
    ("BIT(64)", st.integers(0, 2 ** 64 - 1).map(str)),
    ("YEAR", st.one_of(st.just("0"), st.integers(1901, 2155).map(str))),
    ("DATE", _date()), ("DATETIME", _datetime(0, *_DT_RANGE)), ("DATETIME(6)", _datetime(6, *_DT_RANGE)),
    ("TIMESTAMP(3) NULL", _datetime(3, *_TS_RANGE)), ("TIMESTAMP NULL", _datetime(0, *_TS_RANGE)),
    ("TIME", _time(0)), ("TIME(6)", _time(6)), ("TIME(2)", _time(2)),
    *[(f"VARCHAR(20) CHARACTER SET {cs}", _text(cs)) for cs in ("utf8mb4", "latin1", "cp1250", "sjis", "utf8mb3")],
    ("TEXT", _text("utf8mb4")), ("CHAR(5)", _text("utf8mb4")),
    ("BINARY(4)", st.binary(max_size=4).map(_hex)), ("VARBINARY(16)", st.binary(max_size=16).map(_hex)),
    ("BLOB", st.binary(max_size=40).map(_hex)),
    ("ENUM('a','b','c')", st.sampled_from(["'a'", "'b'", "'c'", "''"])),
    ("SET(" + ",".join(f"'s{i}'" for i in range(64)) + ")",   # a 64th member: a mask past 2**63-1
     st.sets(st.integers(0, 63)).map(lambda s: "'" + ",".join(f"s{i}" for i in sorted(s)) + "'")),
    # a spatial column (beside a text one the compiled decoder cannot parse it: the library does)
    ("POINT", st.tuples(st.integers(-10 ** 6, 10 ** 6), st.integers(-10 ** 6, 10 ** 6))
     .map(lambda p: f"ST_GeomFromText('POINT({p[0]} {p[1]})')")),
    ("SET('x','y','z')", st.sets(st.sampled_from("xyz")).map(lambda s: "'" + ",".join(sorted(s)) + "'")),
    ("JSON", st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                          max_leaves=6).map(lambda v: "'" + __import__("json").dumps(v).replace("\\", "\\\\")
                                            .replace("'", "''") + "'")),
]


@st.composite
def histories(draw):
    columns = draw(st.lists(st.sampled_from(range(len(TYPES))), min_size=1, max_size=6))
    values = [st.one_of(st.just("NULL"), TYPES[c][1]) for c in columns]
    rows = st.tuples(*values)
    txns, key = [], 0
    for _ in range(draw(st.integers(1, 5))):
        statements = []
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["insert", "insert", "update", "delete", "rekey"])) if key else "insert"
            n = draw(st.integers(1, 4))
            if op == "insert":
                statements.append(("insert", [(key + i, draw(rows)) for i in range(n)]))
                key += n
            elif op == "update":
                i = draw(st.integers(0, len(columns) - 1))
                statements.append(("update", i, draw(values[i]), n))
            else:
                statements.append((op, n))
        txns.append(statements)
    return [TYPES[c][0] for c in columns], txns


def _run(cur, table: str, columns: list[str], txns: list) -> None:
    names = [f"c{i}" for i in range(len(columns))]
    for statements in txns:
        cur.execute("BEGIN")
        for s in statements:
            if s[0] == "insert":
                cur.execute(f"INSERT INTO {table} VALUES " + ", ".join(
                    f"({k}, {', '.join(v)})" for k, v in s[1]))
            elif s[0] == "update":
                cur.execute(f"UPDATE {table} SET {names[s[1]]} = {s[2]} ORDER BY id LIMIT {s[3]}")
            elif s[0] == "rekey":
                cur.execute(f"UPDATE {table} SET id = id + 1000000 ORDER BY id DESC LIMIT {s[1]}")
            else:
                cur.execute(f"DELETE FROM {table} ORDER BY id LIMIT {s[1]}")
        cur.execute("COMMIT")


def _read(cfg_raw: dict, decoder: str, server_id: int, resume: dict, end: tuple) -> list:
    raw = {**cfg_raw, "sources": {"s": {**cfg_raw["sources"]["s"], "decoder": decoder, "server_id": server_id}}}
    source = open_source(parse_config(raw).sources["s"])
    items, deadline = [], time.monotonic() + 60
    try:
        for item in source.read_log(resume, lambda: time.monotonic() > deadline):
            if isinstance(item, RowChange):
                items.append(item.event._replace(error=item.event.error is not None))
            elif isinstance(item, TxnEnd):
                items.append(("end", item.pos))
                if (item.pos.log, item.pos.offset) >= end:
                    return items
    finally:
        source.close()
    raise AssertionError(f"{decoder}: the log's end {end} was not reached in 60 s ({len(items)} items)")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(histories())
def test_both_decoders_read_every_generated_history_alike(tmp_path_factory, history):
    columns, txns = history
    db = unique("mes")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            cur.execute("SET SESSION sql_mode = ''")   # zero dates and clipped values, as production has
            cur.execute(f"CREATE TABLE `{db}`.t (id BIGINT PRIMARY KEY, "
                        + ", ".join(f"c{i} {t}" for i, t in enumerate(columns)) + ")")
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
            _run(cur, f"`{db}`.t", columns, txns)
            cur.execute("SHOW MASTER STATUS")
            end_file, end_pos = cur.fetchone()[:2]
            raw = {"sources": {"s": {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                                     "password": "", "tables": [f"{db}.t"], "watermark_namespace": db,
                                     "heartbeat_seconds": 0.1, "zero_dates": "refuse"}},
                   "storage": {"root": str(tmp_path_factory.mktemp("mes"))},
                   "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0"}}
            end = (int(end_file.rsplit(".", 1)[1]), int(end_pos))
            resume = {"file": file, "pos": int(pos)}
            library = _read(raw, "mysql-replication", 7101, resume, end)
            compiled = _read(raw, "mysql-event-stream", 7102, resume, end)
        finally:
            cur.execute(f"DROP DATABASE `{db}`")
    assert any(i[0] != "end" for i in library), "the history logged no row change"
    assert compiled == library


def test_a_row_past_the_decoders_default_event_limit_is_read_whole(tmp_path):
    """mysql-event-stream refuses events over 32 MiB by default; a row may be as large as the
    server's max_allowed_packet. A 40 MiB LONGBLOB is read whole, as the library reads it."""
    db = unique("mesbig")
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.max_allowed_packet")
        packet = cur.fetchone()[0]
        cur.execute(f"SET GLOBAL max_allowed_packet = {max(packet, 64 << 20)}")
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            with mysql_connect() as big, big.cursor() as bc:   # a new session takes the new limit
                bc.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, b LONGBLOB)")
                bc.execute("SHOW MASTER STATUS")
                file, pos = bc.fetchone()[:2]
                bc.execute(f"INSERT INTO `{db}`.t VALUES (1, REPEAT(x'ab', {40 << 20}))")
                bc.execute("COMMIT")
                bc.execute("SHOW MASTER STATUS")
                end_file, end_pos = bc.fetchone()[:2]
            raw = {"sources": {"s": {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                                     "password": "", "tables": [f"{db}.t"], "watermark_namespace": db,
                                     "heartbeat_seconds": 0.1}},
                   "storage": {"root": str(tmp_path)}, "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0"}}
            end = (int(end_file.rsplit(".", 1)[1]), int(end_pos))
            compiled = _read(raw, "mysql-event-stream", 7103, {"file": file, "pos": int(pos)}, end)
        finally:
            cur.execute(f"DROP DATABASE `{db}`")
            cur.execute(f"SET GLOBAL max_allowed_packet = {packet}")
    rows = [i for i in compiled if i[0] != "end"]
    assert len(rows) == 1 and rows[0].after["b"] == b"\xab" * (40 << 20)
