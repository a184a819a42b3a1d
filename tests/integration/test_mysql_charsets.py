"""Every byte of every single-byte character set decodes on the log path exactly as the
server converts it (the dump's path): issue 27 case 5, the class (a real MariaDB)."""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.events import rows_of
from airflow_provider_dblog.engine.sources.base import RowChange
from airflow_provider_dblog.engine.sources.mysql.catalog import server_decode_table
from airflow_provider_dblog.engine.sources.mysql.types import NativeColumn

from test_mysql_source import _close_shared, connect, make_source, ns, read_until, run, until_mark  # noqa: F401

CHARSETS = ["greek", "hebrew", "tis620", "cp1251", "latin2", "koi8r", "ascii", "cp1250", "cp866",
            "macroman"]


@pytest.mark.parametrize("charset", CHARSETS)
def test_every_byte_reads_the_same_from_the_log_and_the_server(mysql_db, make_source, charset):
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE {t} (id INT PRIMARY KEY, c VARCHAR(4) CHARACTER SET {charset})")
    src = make_source([t])
    schema = src.table_schema(t)
    src.ensure_watermark_table()
    _, resume = src.current_resume()
    values = ", ".join(f"({b}, CAST(X'{b:02X}' AS CHAR CHARACTER SET {charset}))" for b in range(1, 256))
    run(f"INSERT INTO {t} VALUES {values}")
    assert run(f"SELECT COUNT(*), SUM(HEX(c) = LPAD(HEX(id), 2, '0')) FROM {t}") == [(255, 255)]
    src.write_watermark("end")
    items = read_until(src, resume, until_mark("end"))
    events = [it.event for it in items if isinstance(it, RowChange)]
    logged = {e.after["id"]: e.after["c"] if e.error is None else f"held: {e.error}" for e in events}
    server = {r["id"]: r["c"] for r in rows_of(schema, src.select_keys(schema, [(b,) for b in range(1, 256)]))}
    assert len(server) == 255
    differ = {f"0x{b:02x}": (logged.get(b), server[b]) for b in server if logged.get(b) != server[b]}
    assert not differ, differ


def test_the_static_latin1_codec_is_the_servers_table(servers):
    conn = connect()
    try:
        with conn.cursor() as cur:
            def query(sql, args):
                cur.execute(sql, args)
                return list(cur.fetchall())
            table = server_decode_table(query, "latin1")
    finally:
        conn.close()
    n = NativeColumn("c", "varchar", "varchar(1)", "string", charset="latin1")
    assert [bytes([b]).decode(n.encoding) for b in range(256)] == table


def test_a_column_altered_to_a_single_byte_charset_decodes_as_the_server(mysql_db, make_source):
    """The refresh path (an ALTER read from the log) loads the new charset's table too."""
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE {t} (id INT PRIMARY KEY, c VARCHAR(4) CHARACTER SET utf8mb4)")
    src = make_source([t])
    schema = src.table_schema(t)
    src.ensure_watermark_table()
    _, resume = src.current_resume()
    run(f"INSERT INTO {t} VALUES (1, 'a')")
    run(f"ALTER TABLE {t} MODIFY c VARCHAR(4) CHARACTER SET hebrew")
    run(f"INSERT INTO {t} VALUES (2, CAST(X'AF' AS CHAR CHARACTER SET hebrew)), "
        f"(3, CAST(X'C0' AS CHAR CHARACTER SET hebrew))")
    src.write_watermark("end")
    items = read_until(src, resume, until_mark("end"))
    logged = {e.after["id"]: (e.after["c"], e.error) for e in (it.event for it in items if isinstance(it, RowChange))}
    server = {r["id"]: r["c"] for r in rows_of(schema, src.select_keys(schema, [(2,), (3,)]))}
    assert server == {2: "‾", 3: "?"}
    assert logged[2] == ("‾", None) and logged[3] == ("?", None), logged
