"""A MariaDB table renamed away between the catalog's reads of its shape (found by the
schema fuzzer, seed 11: ``ALTER TABLE a RENAME TO x; ALTER TABLE x RENAME TO a`` while the
tail refreshed ``a`` after an earlier ALTER): SHOW CREATE TABLE then fails with "doesn't
exist", which stopped the tail. It must be the same as a table gone before the reads
(UnknownTableError: the tail's refresh treats the table as renamed or dropped)."""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.errors import UnknownTableError
from airflow_provider_dblog.engine.sources.mysql.catalog import read_table

from test_mysql_source import _close_shared, connect, make_source, ns, run  # noqa: F401


def test_a_table_renamed_away_between_the_catalog_reads_is_unknown(mysql_db):
    t = f"{mysql_db}.a"
    run(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)")
    conn = connect()

    def query(sql, args=None):   # the real server; the RENAME lands just before SHOW CREATE TABLE
        if sql.startswith("SHOW CREATE TABLE"):
            run(f"RENAME TABLE {t} TO {mysql_db}.away")
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    try:
        with pytest.raises(UnknownTableError, match="no longer exists"):
            read_table(query, t, "src", False)
        run(f"RENAME TABLE {mysql_db}.away TO {t}")
        assert read_table(lambda sql, args=None: run(sql, args), t, "src", False).schema.key == ("id",)
    finally:
        conn.close()
