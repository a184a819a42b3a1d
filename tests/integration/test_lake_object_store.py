"""Lake targets on an object store (issue 28: a Delta ``path`` may be any URI delta-rs
takes; an Iceberg warehouse any URI PyIceberg's FileIO takes), against a real S3 server
(moto's, started here as its own process) through the target's ``storage_options``:
convergence under writes and a full dump, the changelog table, a replay that makes no
commit, maintenance, the table listing and ``drop_all``, all with every byte in the
bucket (nothing on the local disk). The credentials come from the environment
(``${VAR}`` in the config), never from the config text.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from airflow_provider_dblog.engine.apply_batch import LocalApplier
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.targets import open_target
from helpers import POSTGRES_PORT, unique

S3_PORT = int(os.environ.get("DBLOG_TEST_S3_PORT", 15990))
ENDPOINT = f"http://127.0.0.1:{S3_PORT}"
KEYS = {"DBLOG_TEST_S3_KEY": "test-key", "DBLOG_TEST_S3_SECRET": "test-secret"}


@pytest.fixture(scope="module")
def s3(servers):
    """moto's S3 server in its own process (in this process, delta-rs's object store
    would wait on the GIL the server needs), stopped at the module's end."""
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(S3_PORT)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", S3_PORT), 0.5).close()
            break
        except OSError:
            assert proc.poll() is None, "moto_server exited"
            assert time.monotonic() < deadline, "moto_server did not listen"
            time.sleep(0.1)
    old = {k: os.environ.get(k) for k in KEYS}
    os.environ.update(KEYS)
    try:
        yield boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=KEYS["DBLOG_TEST_S3_KEY"],
                           aws_secret_access_key=KEYS["DBLOG_TEST_S3_SECRET"], region_name="us-east-1")
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        proc.terminate()
        proc.wait(30)


def _target(kind: str, bucket: str) -> dict:
    if kind == "delta":
        return {"kind": "delta", "source": "src", "path": f"s3://{bucket}/lake", "changelog": True,
                "storage_options": {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": True,
                                    "AWS_ACCESS_KEY_ID": "${DBLOG_TEST_S3_KEY}",
                                    "AWS_SECRET_ACCESS_KEY": "${DBLOG_TEST_S3_SECRET}",
                                    "conditional_put": "etag"}}   # S3's If-Match: no two commits of a version
    return {"kind": "iceberg", "source": "src", "path": f"s3://{bucket}/warehouse", "changelog": True,
            "host": "127.0.0.1", "port": POSTGRES_PORT, "user": "postgres", "database": unique("cat"),
            "storage_options": {"s3.endpoint": ENDPOINT, "s3.region": "us-east-1",
                                "s3.access-key-id": "${DBLOG_TEST_S3_KEY}",
                                "s3.secret-access-key": "${DBLOG_TEST_S3_SECRET}"}}


def _objects(s3, bucket: str) -> list[str]:
    keys, token = [], None
    while True:
        page = s3.list_objects_v2(Bucket=bucket, **({"ContinuationToken": token} if token else {}))
        keys += [o["Key"] for o in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return keys
        token = page["NextContinuationToken"]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_lake_target_on_s3_converges_replays_and_is_maintained(src_db, make_cdc, s3, tmp_path, kind):
    bucket = unique("lake").replace("_", "-")
    s3.create_bucket(Bucket=bucket)
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(10,2)")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES " + ", ".join(
            f"({i}, {i}, 'row {i}', {i}.5)" for i in range(1, 201)))
    cdc = make_cdc(["t"], targets={"lake": _target(kind, bucket)})
    assert "test-secret" not in cdc.path.read_text()   # the config holds ${VAR}, not the secret
    cdc.start_tail()
    cdc.dump_local("t")
    for n in range(3):   # small applies: several commits and files to maintain
        with src_db.cursor() as cur:
            cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id %% 7 = %s", (f"u{n}", n))
            cur.execute("DELETE FROM t WHERE id = %s", (100 + n,))
            cur.execute("INSERT INTO t (id, v, s, d) VALUES (%s, 1, 'new', 1.25)", (1000 + n,))
        cdc.drain()
        res = cdc.apply_local("lake")[f"{cdc.db}.t"]
        assert res["status"] == "applied" and res["changelog_rows"] == res["events"], res
    cdc.assert_equal("t", target="lake")

    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    names = {f"{cdc.db}__t", f"{cdc.db}__t__changelog"}
    assert target.uri(schema).startswith(f"{'s3' if kind == 'delta' else 'iceberg'}://")
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -v WHERE id < 20")
    cdc.drain()
    applier = LocalApplier(target, cdc.store, cdc.state, "src")
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    assert applier.apply_batch(batch)["updated"] == 19
    version = target.version(schema)
    assert applier.apply_batch(batch)["changelog_rows"] == 0   # the same batch again (a replay)
    assert target.version(schema) == version   # no commit
    # every table file is in the bucket, none on the local disk (only the engine's own log is)
    data = [k for k in _objects(s3, bucket) if k.endswith(".parquet")]
    assert {k.split("/")[1 if kind == "delta" else 2] for k in data} >= names, data[:5]
    assert [p for p in tmp_path.rglob("*.parquet") if "storage" not in p.relative_to(tmp_path).parts] == []

    report = target.maintain(schema, retention_hours=168)
    assert report.files_after <= report.files_before and report.files_after >= 1, report
    cdc.assert_equal("t", target="lake")
    assert names <= set(target.table_names()), target.table_names()
    if kind == "delta":   # a table's directory in the bucket: gone with drop_all
        assert set(target.drop_all()) >= names
        assert not any(k.startswith(f"lake/{cdc.db}__t/") for k in _objects(s3, bucket))
