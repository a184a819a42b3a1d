"""Keys of every supported key type are dumped completely, by range and by key list (issue 11).

On the real servers, one table per key type, with values chosen where the orders that
matter disagree: text order against numeric order (9.5 / 10.5, negative TIME), ENUM
declaration order against label order, case-insensitive and PAD SPACE collations
against byte order, BC dates and ±infinity, unsigned BIGINT past 2^63, DECIMAL(38,10).

1. Into empty targets, a key-list dump of every key (as a user would type them, from
   the source's own text) brings every row, and no key is reported missing.
2. Every table's target then gets a few wrong rows and a few orphans (keys the source
   does not have); a full dump of all tables on Spark (per table three chunks of 99 keys in
   eight partitions each, and a last chunk of three keys: 27 partition bounds per table, each
   a key the source chose sent back to it as a literal) and the apply with its orphan sweep
   make every target equal to its source.

(The key-list dump comes first so that it also fills the targets the range dump repairs:
one Spark application per source instead of two, for the same proofs.)
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.keys import encode_scalar

# name -> (key columns DDL, value expression of the key from n = 1..N, as SQL)
MARIADB_TABLES = {
    "k_int": ("k INT", "n * 7 - 300"),
    "k_ubig": ("k BIGINT UNSIGNED", "18446744073709551615 - n * 9223372036854775"),
    "k_dec": ("k DECIMAL(38,10)", "(n - 150) * 1234567.8912345678 + 0.0000000001"),
    "k_num": ("k DECIMAL(65,30)", "CAST(CONCAT(n - 150, '9999999999999999999999999999999.', n) AS DECIMAL(65,30))"),
    "k_ci": ("k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
             "CONCAT(IF(n % 2, 'a', 'B'), n % 13, IF(n % 3, 'x', 'Y'), n)"),
    # PAD SPACE: 'p7' sorts after 'p7<TAB>' (as if 'p7 '), though it is a prefix of it
    "k_pad": ("k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
              "CONCAT('p', n DIV 2, IF(n % 2, CHAR(9), ''))"),
    "k_enum": ("k ENUM('zulu','alpha','mike','bravo'), k2 INT",
               "ELT(n % 4 + 1, 'zulu','alpha','mike','bravo')"),
    "k_date": ("k DATE", "DATE '1000-01-01' + INTERVAL n * 3011 DAY"),
    "k_dt": ("k DATETIME(6)", "TIMESTAMP '1500-06-01 00:00:00' + INTERVAL n * 999999999 MICROSECOND"),
    "k_ts": ("k TIMESTAMP(6)", "TIMESTAMP '2000-01-01 00:00:00' + INTERVAL n * 99999 SECOND"),
    "k_time": ("k TIME(3)", "SEC_TO_TIME((n - 150) * 10007.125)"),
    "k_bin": ("k VARBINARY(8)", "UNHEX(LPAD(HEX(n * 997), 6, '0'))"),
    "k_year": ("k YEAR, k2 INT", "1901 + n % 255"),
    "k_comp": ("k VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci, k2 INT",
               "IF(n % 2, 'Ab', 'aC')"),
}
PG_TABLES = {
    "k_int": ("k int", "n * 7 - 300"),
    "k_num": ("k numeric", "((n - 150) * 10.5 + CASE WHEN n % 2 = 0 THEN 0.5 ELSE 0 END)::numeric"),
    "k_text": ("k text COLLATE \"C\"", "CASE WHEN n % 2 = 0 THEN 'a' ELSE 'B' END || n"),
    "k_textd": ("k text", "CASE WHEN n % 2 = 0 THEN 'a' ELSE 'B' END || (n % 7) || '-' || n"),
    "k_uuid": ("k uuid", "md5(n::text)::uuid"),
    "k_date": ("k date", "CASE n WHEN 1 THEN '-infinity'::date WHEN 2 THEN 'infinity'::date "
                         "ELSE date '0044-03-15 BC' + n * 5011 END"),
    "k_ts": ("k timestamp", "timestamp '4000-01-01 00:00:00 BC' + n * interval '40 years 3 days 7 us'"),
    "k_tstz": ("k timestamptz", "timestamptz '2000-01-01 00:00+05' + n * interval '1 day 1 us'"),
    "k_bytea": ("k bytea", "decode(lpad(to_hex(n * 997), 6, '0'), 'hex')"),
    "k_inet": ("k inet", "('10.' || (n % 3) || '.0.' || (n % 256) || '/' || (8 + n % 24))::inet"),
    "k_interval": ("k interval", "(n - 150) * interval '1 day 3 hours'"),
    "k_enum": ("k mood, k2 int", "(ARRAY['zulu','alpha','mike','bravo'])[n % 4 + 1]::mood"),
    "k_comp": ("k text, k2 int", "CASE WHEN n % 2 = 0 THEN 'Ab' ELSE 'aC' END"),
}
N = 300
# the range dump: per table three chunks of 99 keys, eight partitions each, and a last chunk of
# three keys (fewer keys than partitions)
CHUNK, PARTS = 99, 8


def _setup(src_db) -> dict:
    tables = MARIADB_TABLES if src_db.kind == "mysql" else PG_TABLES
    with src_db.cursor() as cur:
        if src_db.kind == "postgres":
            cur.execute("CREATE TYPE mood AS ENUM ('zulu', 'alpha', 'mike', 'bravo')")
        for name, (cols, expr) in tables.items():
            composite = "k2" in cols
            key = "k, k2" if composite else "k"
            src_db.create_table(cur, name, f"{cols}, v int, PRIMARY KEY ({key})")
            k2 = ", n" if composite else ""
            if src_db.kind == "mysql":
                cur.execute(f"INSERT IGNORE INTO {name} (k{k2.replace(', n', ', k2')}, v) "
                            f"SELECT {expr}{k2}, n FROM (SELECT CAST(seq AS SIGNED) AS n FROM seq_1_to_{N}) AS s")
            else:
                cur.execute(f"INSERT INTO {name} (k{k2.replace(', n', ', k2')}, v) "
                            f"SELECT {expr}{k2}, n FROM generate_series(1, {N}) AS n ON CONFLICT DO NOTHING")
    return tables


def _damage(cdc, table: str) -> None:
    """Wrong values in some target rows, and orphans: the copy of a row under a key the
    source does not have (its key text plus a suffix where the type allows one)."""
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target() as t, t.conn, t.conn.cursor() as cur:
        name = f'"{t.schema}"."{cdc.db}__{table}"'
        cur.execute(f"UPDATE {name} SET v = -1 WHERE v % 5 = 0")
        cur.execute(f"DELETE FROM {name} WHERE v % 7 = 0")
        if schema.column("k").type in ("string", "int32", "int64"):
            orphan = "k || '~'" if schema.column("k").type == "string" else "k + 100000"
            others = ", ".join(c for c in schema.column_names if c != "k")
            cur.execute(f"INSERT INTO {name} (k, {others}, _dblog_pos) SELECT {orphan}, {others}, "
                        f"_dblog_pos FROM {name} WHERE v % 11 = 1")


@pytest.mark.parametrize("src_db", ["mariadb", "postgres"], indirect=True)
def test_every_key_type_is_dumped_completely(make_cdc, src_db):
    tables = _setup(src_db)
    cdc = make_cdc(list(tables))
    assert not cdc.source.check(scan_values=True), cdc.source.check(scan_values=True)
    cdc.start_tail()
    names = [f"{cdc.db}.{t}" for t in tables]

    # 1. a key-list dump of every key, the keys as the source prints them, into empty targets
    with cdc.target() as t:
        t.drop_all()
    for table in tables:
        schema = cdc.source.table_schema(f"{cdc.db}.{table}")
        keys = [[encode_scalar(v) for v in key] for key in _all_keys(cdc, schema)]
        rid = cdc.request(DumpSpec("keys", [schema.qualified], keys=keys, chunk_size=101))
        DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        progress = cdc.state.progress(rid, schema.qualified)
        assert progress["missing_count"] == 0, (table, progress["missing"][:5])
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    for t in tables:
        diff = cdc.compare(t)
        assert diff.equal, f"{t} after a key-list dump: {diff.describe()}"
        _damage(cdc, t)

    # 2. a full dump by key ranges repairs every table, orphans included. Every chunk end and
    # every partition bound within a chunk is a key the source chose, sent back to it as a
    # literal in a range predicate: a few chunks of many partitions each test as many
    # literals as many chunks of a few, with a quarter of the chunk lifecycles (each a Spark
    # job, a window and a HW wait)
    rid = cdc.request(DumpSpec("all", names, chunk_size=CHUNK, parallelism=PARTS))
    assert cdc.dump_spark(rid)["status"] == "done"
    cdc.drain()
    res = run_apply(cdc.cfg, "tgt", via="local")
    for t in tables:
        diff = cdc.compare(t)
        assert diff.equal, f"{t} after a range dump: {diff.describe()}"
        assert diff.source_rows > 100, t
        chunks = cdc.state.progress(rid, f"{cdc.db}.{t}")["chunks"]
        assert chunks == -(-diff.source_rows // CHUNK) > 1, (t, chunks)  # the full chunks and the rest
    assert res["orphans_deleted"] > 0, res


def _all_keys(cdc, schema) -> list[tuple]:
    """Every key of the table as the source reads it (a WHERE dump's own key select)."""
    return cdc.source.keys_where(schema, f"{schema.key[0]} IS NOT NULL", 100_000)
