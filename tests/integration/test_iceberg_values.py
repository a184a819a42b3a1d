"""Every value of the type matrix (test_type_fidelity.py) reaches an Iceberg table exactly
(issue 28), on the log path and on the dump path, both sources; the table read back with
pyiceberg equals the source row for row and the PostgreSQL target from the same log.
PostgreSQL's dates and timestamps past what PyIceberg writes (years 1..9999:
lake_values.ICEBERG_RANGES) hold the table on the Iceberg target only, with the message;
once they change at the source, the rest of the matrix arrives exactly."""
from __future__ import annotations

import pytest

from test_type_fidelity import MARIADB_COLUMNS, MARIADB_ROWS, PG_COLUMNS, PG_ROWS, PG_SETUP


def _apply(cdc, table: str, *targets: str) -> None:
    for target in targets:
        res = cdc.apply_local(target)
        assert res[f"{cdc.db}.{table}"]["status"] in ("applied", "up_to_date", "empty"), (target, res)


@pytest.mark.parametrize("path", ["log", "dump"])
def test_every_value_of_the_type_matrix_reaches_an_iceberg_table(src_db, make_cdc, path):
    columns, rows = (MARIADB_COLUMNS, MARIADB_ROWS) if src_db.kind == "mysql" else (PG_COLUMNS, PG_ROWS)
    with src_db.cursor() as cur:
        if src_db.kind != "mysql":
            for stmt in PG_SETUP:
                cur.execute(stmt)
        src_db.create_table(cur, "m", "id integer PRIMARY KEY, " + ", ".join(f"{c} {t}" for c, t in columns))
    insert = [f"INSERT INTO m VALUES ({', '.join(row)})".replace("%", "%%") for row in rows]
    if path == "dump":   # the rows are there before the capture starts: only the dump carries them
        with src_db.cursor() as cur:
            for stmt in insert:
                cur.execute(stmt, ())
    cdc = make_cdc(["m"], lake="iceberg")
    cdc.start_tail()
    if path == "dump":
        cdc.dump_local("m")
    else:
        with src_db.cursor() as cur:
            for stmt in insert:
                cur.execute(stmt, ())
    cdc.drain()
    if src_db.kind != "mysql":
        res = cdc.apply_local("lake")[f"{cdc.db}.m"]
        assert res["status"] == "held", res
        assert f"{cdc.db}.m." in res["held"]["error"] and "years 1..9999" in res["held"]["error"], res
        _apply(cdc, "m", "tgt")
        cdc.assert_equal("m")   # the PostgreSQL target holds them: only the Iceberg target stops
        with src_db.cursor() as cur:   # rows 1 and 2 hold BC, year-99999 and infinite values
            cur.execute("UPDATE m SET dt = '0001-01-01', ts = '0001-01-01 00:00:00', ts3 = '0001-01-01', "
                        "tz = '0001-01-01 00:00:00+00' WHERE id = 1")
            cur.execute("UPDATE m SET dt = '9999-12-31', ts = '9999-12-31 23:59:59.999999', "
                        "ts3 = '9999-12-31 23:59:59.999', tz = '9999-12-31 23:59:59.999999+00' WHERE id = 2")
        cdc.drain()
    _apply(cdc, "m", "lake", "tgt")
    cdc.assert_equal("m", target="lake")
    cdc.assert_equal("m")
