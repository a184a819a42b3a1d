"""``dblog verify`` (issue 29) on real servers: a target damaged in each way while a writer
runs on the same table is reported with exactly the damaged keys (no other), ``--repair``
makes it equal, and a second verification finds nothing; an undamaged table verifies
equal every time under a writer whose schedule hypothesis generates (updates, key-changing
updates, delete and re-insert, inserts, deletes), with the real tail, apply and verify.

The writer and the apply run in threads beside the verification, as the tail does (the
apply thread plays the apply DAG: a verification waits for the target to pass its HW)."""
from __future__ import annotations

import contextlib
import json
import datetime as dt
import decimal
import random
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from airflow_provider_dblog.engine.verify_run import last_verifications, run_verify
from helpers import pg_connect

ROWS = 240
WRITER_KEYS = range(161, 241)   # the writer's rows; the damage is done to keys below
COLUMNS = {  # every type class of the type matrix the two sources share
    "mysql": "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(12,3), f DOUBLE, day DATE, "
             "ts DATETIME(6), b BLOB, j JSON",
    "postgres": "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(12,3), f DOUBLE PRECISION, day DATE, "
                "ts TIMESTAMP(6), b BYTEA, j JSONB"}
# one damaged key per column: the column changed in the target, through SQL of the target
DAMAGE = {5: ("v", "-5"), 6: ("s", "'tampered'"), 7: ("d", "7.001"), 8: ("f", "8.000000000001"),
          9: ("day", "DATE '1999-12-31'"), 10: ("ts", "TIMESTAMP '2001-01-01 00:00:00.000001'"),
          11: ("b", "'\\x00ff'::bytea"), 12: ("j", "'{\"k\": 13}'")}
# and each source's own type classes: time / interval, bit / bool, enum / set, uuid, arrays
MORE_COLUMNS = {
    "mysql": ("tm TIME(3), bt BIT(8), en ENUM('a','b','c'), st SET('x','y')",
              "SEC_TO_TIME(seq + 0.5), seq % 256, ELT(seq % 3 + 1, 'a', 'b', 'c'), ELT(seq % 2 + 1, 'x', 'y')"),
    "postgres": ("tm INTERVAL, ok BOOLEAN, u UUID, arr INT[]",
                 "make_interval(secs => seq + 0.5), seq % 2 = 0, md5(seq::text)::uuid, ARRAY[seq, seq + 1]")}
MORE_DAMAGE = {   # (the target's SQL, the value a lake table is given)
    "mysql": {13: ("tm", "INTERVAL '00:00:07'", "00:00:07.000"), 14: ("bt", "77", 77), 15: ("en", "'c'", "c"),
              16: ("st", "'x,y'", "x,y")},
    "postgres": {13: ("tm", "INTERVAL '00:00:07'", "00:00:07"), 14: ("ok", "false", False),
                 15: ("u", "'00000000-0000-0000-0000-000000000000'", "00000000-0000-0000-0000-000000000000"),
                 16: ("arr", "'{9,9}'", "{9,9}")}}
DELETED, EXTRA = 20, 5000


def damage(kind: str) -> dict[int, tuple[str, str]]:
    """Every damaged key of a source kind's table: (column, the target's SQL value)."""
    return DAMAGE | {k: (c, v) for k, (c, v, _) in MORE_DAMAGE[kind].items()}


def _seed(src_db, rows: int = ROWS) -> None:
    blob = src_db.md5_bytes("seq")
    with src_db.cursor() as cur:
        more, values = MORE_COLUMNS[src_db.kind]
        src_db.create_table(cur, "t", f"{COLUMNS[src_db.kind]}, {more}")
        day = "DATE '2024-01-01' + " + ("INTERVAL seq DAY" if src_db.kind == "mysql" else "seq")
        cur.execute(f"INSERT INTO t SELECT seq, seq * 3, CONCAT('row ', seq), seq + 0.125, seq / 7.0, {day}, "
                    f"{src_db.ts_plus_seconds('seq')}, {blob}, {src_db.json_object('k', 'seq')}, {values} "
                    f"FROM {src_db.series(rows)}")


class Background:
    """The apply (every 0.2 s) and, given ``ops``, a writer cycling through them, in threads."""

    def __init__(self, cdc, ops: list | None = None, target: str = "tgt"):
        self.cdc, self.ops, self.target = cdc, ops, target
        self.stop, self.errors, self.writes = threading.Event(), [], 0
        self.threads = [threading.Thread(target=self._apply, daemon=True)]
        if ops:
            self.threads.append(threading.Thread(target=self._write, daemon=True))

    def _apply(self):
        while not self.stop.is_set():
            try:
                run_apply(self.cdc.cfg, self.target, via="local")
            except Exception as e:   # noqa: BLE001 - surfaced at the end
                self.errors.append(e)
                return
            self.stop.wait(0.2)

    def _write(self):
        try:
            with self.cdc.sdb.cursor() as cur:
                while not self.stop.is_set():
                    for sql, args in self.ops:
                        if self.stop.is_set():
                            break
                        cur.execute(sql, args)   # (autocommit: each its own transaction)
                        self.writes += 1
                        time.sleep(0.002)
        except Exception as e:   # noqa: BLE001 - surfaced at the end
            self.errors.append(e)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors


def _writer_ops(kind: str, rng: random.Random, n: int) -> list[tuple[str, tuple]]:
    """A steady writer on WRITER_KEYS: updates, key-changing updates (and back), a delete
    and its re-insert, an insert and its delete; each cycle leaves the keys as they were."""
    ops = []
    for _ in range(n):
        k = rng.choice(WRITER_KEYS)
        what = rng.choice(("update", "move", "reinsert", "insert"))
        if what == "update":
            ops.append(("UPDATE t SET v = v + 1, s = %s WHERE id = %s", (f"w{rng.randrange(1000)}", k)))
        elif what == "move":   # the primary key changes, then changes back
            ops += [("UPDATE t SET id = id + 100000 WHERE id = %s", (k,)),
                    ("UPDATE t SET id = id - 100000 WHERE id = %s", (k + 100000,))]
        elif what == "reinsert":
            ops += [("DELETE FROM t WHERE id = %s", (k,)),
                    ("INSERT INTO t (id, v, s) VALUES (%s, %s, 'again')", (k, rng.randrange(100)))]
        else:
            new = 200000 + rng.randrange(1000)
            ops += [("INSERT INTO t (id, v) VALUES (%s, 1)", (new,)), ("DELETE FROM t WHERE id = %s", (new,))]
    return ops


def _damage_postgres(cdc, schema) -> None:
    tcfg = cdc.cfg.target("tgt")
    name = f'"{tcfg.schema}"."{target_table_name(schema)}"'
    with contextlib.closing(pg_connect(tcfg.endpoint.database)) as conn, conn, conn.cursor() as cur:
        for key, (col, value) in damage(cdc.sdb.kind).items():
            cur.execute(f'UPDATE {name} SET "{col}" = {value} WHERE id = %s', (key,))
        cur.execute(f"DELETE FROM {name} WHERE id = %s", (DELETED,))
        cur.execute(f"INSERT INTO {name} (id, v, _dblog_pos) SELECT %s, 1, _dblog_pos FROM {name} WHERE id = 1",
                    (EXTRA,))


def _damage_lake(cdc, schema, target: str) -> None:
    """The lake table's rows of the damaged keys rewritten by its own library; the extra key
    and a duplicate of key 30 appended behind the apply."""
    lake = cdc.target(target)
    rows = lake.read(schema)
    ids = rows["id"].to_pylist()
    tampered = {5: -5, 6: "tampered", 7: decimal.Decimal("7.001"), 8: 8.000000000001,
                9: dt.date(1999, 12, 31), 10: dt.datetime(2001, 1, 1, 0, 0, 0, 1), 11: b"\x00\xff", 12: '{"k": 13}'}
    tampered |= {k: v for k, (_, _, v) in MORE_DAMAGE[cdc.sdb.kind].items()}
    cols = damage(cdc.sdb.kind)
    keep = [i for i, k in enumerate(ids) if k not in tampered and k != DELETED]
    changed = rows.take([ids.index(k) for k in tampered]).to_pylist()
    for r in changed:
        col, value = cols[r["id"]][0], tampered[r["id"]]
        # a column the lake holds as the source's text (PostgreSQL numeric): the value's text
        text = pa.types.is_string(rows.schema.field(col).type) or pa.types.is_large_string(rows.schema.field(col).type)
        r[col] = str(value) if text and not isinstance(value, (str, bool)) else value
    extra = rows.take([ids.index(1), ids.index(30)]).to_pylist()
    extra[0]["id"] = EXTRA
    new = pa.concat_tables([rows.take(keep), pa.Table.from_pylist(changed + extra, schema=rows.schema)])
    if lake.config.kind == "delta":
        from deltalake import write_deltalake
        write_deltalake(lake.table_path(schema), new, mode="overwrite")
    else:
        lake._load(schema).overwrite(new)


def _keys(report: dict, kind: str) -> list:
    return sorted(k[0] if kind != "different" else (k["key"][0], tuple(k["columns"])) for k in report["keys"][kind])


@pytest.mark.parametrize("kind", ["postgres", "delta", "iceberg"])
def test_every_damage_is_found_exactly_under_a_writer_and_repaired(src_db, make_cdc, kind):
    _seed(src_db)
    target = "tgt" if kind == "postgres" else "lake"
    cdc = make_cdc(["t"], lake=False if kind == "postgres" else kind)
    table = f"{cdc.db}.t"
    cdc.start_tail()
    cdc.dump_local("t")
    cdc.apply_local(target)
    cdc.assert_equal("t", target=target)
    schema = cdc.source.table_schema(table)
    if target == "tgt":
        _damage_postgres(cdc, schema)
    else:
        _damage_lake(cdc, schema, target)
    with Background(cdc, _writer_ops(src_db.kind, random.Random(7), 40), target) as bg:
        out = run_verify(cdc.cfg, target, DumpSpec("table", [table]), wait_s=120)
        report = out["tables"][table]
        assert not out["equal"] and report["missing"] == 1 and _keys(report, "missing") == [DELETED], report
        want_extra = [EXTRA] if target == "tgt" else [30, EXTRA]   # a lake table may hold a key twice
        assert _keys(report, "extra") == want_extra, report
        damaged = damage(src_db.kind)
        assert _keys(report, "different") == sorted((k, (c,)) for k, (c, _) in damaged.items()), report
        assert report["compared"] + report["skipped"] >= ROWS - len(WRITER_KEYS), report
        status = last_verifications(cdc.state)[f"{table}|{target}"]
        assert (status["equal"], status["different"], status["at"]) == (False, len(damaged), report["at"]), status

        fixed = run_verify(cdc.cfg, target, DumpSpec("table", [table]), repair=True, wait_s=120)
        assert fixed["repaired"] and fixed["repair"][table]["keys"] == len(damaged) + 1 + len(want_extra), fixed
        again = run_verify(cdc.cfg, target, DumpSpec("table", [table]), wait_s=120)
        assert again["equal"], again["tables"][table]
        assert bg.writes > 0
    cdc.drain()
    cdc.apply_local(target)
    cdc.assert_equal("t", target=target)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 30), rounds=st.integers(1, 2),
       chunk=st.sampled_from([37, 100, 1000]))
def _no_false_positive(cdc, table, skipped, seed, n, rounds, chunk):
    ops = _writer_ops(cdc.sdb.kind, random.Random(seed), n)
    with Background(cdc, ops):
        for _ in range(rounds):
            out = run_verify(cdc.cfg, "tgt", DumpSpec("table", [table], chunk_size=chunk), wait_s=120)
            assert out["equal"], (seed, n, chunk, out["tables"][table])
            skipped.append(out["tables"][table]["skipped"])


def test_an_undamaged_table_verifies_equal_under_any_writer(src_db, make_cdc):
    """Property: whatever the writer's schedule and the chunk size, every verification of an
    undamaged table under it is equal (no false positive)."""
    _seed(src_db)
    cdc = make_cdc(["t"])
    table = f"{cdc.db}.t"
    cdc.start_tail()
    cdc.dump_local("t")
    cdc.apply_local()
    skipped: list[int] = []
    _no_false_positive(cdc, table, skipped)
    assert any(skipped), skipped   # the writer changed keys while chunks were read: the property had work
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal("t")


def test_a_key_list_and_a_condition_verify_only_their_rows_through_the_command(src_db, make_cdc, capsys):
    """``dblog verify --keys`` / ``--where``: only those rows (a requested key the source
    lacks and the target holds is extra); the JSON report on stdout, exit 1 when it differs,
    0 when equal; bad input exits 2 with the message, before anything is written."""
    from airflow_provider_dblog.cli import main
    _seed(src_db)
    cdc = make_cdc(["t"])
    table = f"{cdc.db}.t"
    cdc.start_tail()
    cdc.dump_local("t")
    cdc.apply_local()
    _damage_postgres(cdc, cdc.source.table_schema(table))
    base = ["--config", str(cdc.path), "verify", "--table", table, "--target", "tgt", "--via", "local", "--wait", "120"]
    with Background(cdc):
        capsys.readouterr()
        assert main(base + ["--keys", f"[5, 30, {DELETED}, {EXTRA}]"]) == 1
        report = json.loads(capsys.readouterr().out)["tables"][table]
        assert (_keys(report, "missing"), _keys(report, "extra"), _keys(report, "different")) == (
            [DELETED], [EXTRA], [(5, ("v",))]), report
        assert report["compared"] == 2, report   # 5 and 30 (DELETED: missing, EXTRA: extra)
        assert main(base + ["--where", "id BETWEEN 6 AND 8"]) == 1
        report = json.loads(capsys.readouterr().out)["tables"][table]
        assert _keys(report, "different") == [(6, ("s",)), (7, ("d",)), (8, ("f",))] and report["compared"] == 3
        assert not report["missing"] and not report["extra"], report
        assert main(base + ["--keys", "[1, 2]"]) == 0
        assert json.loads(capsys.readouterr().out)["equal"] is True
        requests = cdc.state.requests(1000)
        for bad, words in ((["--keys", "[[1, 2]]"], "expected 1 value(s)"),
                           (["--where", "id = (SELECT 1)"], "after id"),
                           (["--table", "nope.nope"], "nope.nope")):
            assert main(base + bad) == 2
            assert words in capsys.readouterr().err
        assert cdc.state.requests(1000) == requests   # refused before any request


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)   # the Spark chunk reader is the dump's, per source tested there
def test_a_whole_table_verification_reads_its_chunks_on_spark(src_db, make_cdc, capsys):
    """``dblog verify --via spark`` (the default for a whole table): the dump job reads the
    verification's chunks through Spark's JDBC reader; the same report as in-process."""
    from airflow_provider_dblog.cli import main
    _seed(src_db)
    cdc = make_cdc(["t"])
    table = f"{cdc.db}.t"
    cdc.start_tail()
    cdc.dump_local("t")
    cdc.apply_local()
    _damage_postgres(cdc, cdc.source.table_schema(table))
    with Background(cdc):
        capsys.readouterr()
        assert main(["--config", str(cdc.path), "verify", "--table", table, "--chunk-size", "100", "--wait", "300"]) == 1
    out = json.loads(capsys.readouterr().out)
    report = out["tables"][table]
    assert (_keys(report, "missing"), _keys(report, "extra")) == ([DELETED], [EXTRA]), report
    assert _keys(report, "different") == sorted((k, (c,)) for k, (c, _) in damage(src_db.kind).items()), report
    assert report["compared"] == ROWS - 1, report   # every row but the missing one (the different ones too)
    assert cdc.state.request(out["request"])["spec"]["verify"] == "tgt"
