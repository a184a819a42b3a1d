"""The YAML config: environment references, Airflow-style connections, clear errors."""
from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.engine.config import ConfigError, parse_config

BASE = {
    "sources": {"shop": {"kind": "mysql", "conn_id": "shop_db", "tables": ["shop.orders"]}},
    "targets": {"wh": {"kind": "postgres", "source": "shop", "conn_id": "wh_db"}},
    "state": {"conn_id": "state_redis"},
    "storage": {"root": "/tmp/x"},
}


def test_connections_from_airflow_uri_and_json_forms():
    env = {
        "AIRFLOW_CONN_SHOP_DB": "mysql://cdc%40user:p%40ss@db.example:3307/shop",
        "AIRFLOW_CONN_WH_DB": json.dumps({"conn_type": "postgres", "host": "wh", "port": 5433,
                                          "login": "loader", "password": "s3cret", "schema": "warehouse"}),
        "AIRFLOW_CONN_STATE_REDIS": "redis://:pw@cache:6380/2",
    }
    cfg = parse_config(BASE, env=env)
    src = cfg.source().endpoint
    assert (src.host, src.port, src.user, src.password, src.database) == ("db.example", 3307, "cdc@user", "p@ss", "shop")
    tgt = cfg.target().endpoint
    assert (tgt.host, tgt.port, tgt.user, tgt.password, tgt.database) == ("wh", 5433, "loader", "s3cret", "warehouse")
    assert cfg.redis_url == "redis://:pw@cache:6380/2"
    assert "s3cret" not in repr(cfg) and "p@ss" not in repr(cfg)


def test_yaml_fields_win_over_the_connection():
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_WH_DB": "postgres://u:p@h:2/d",
           "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0"}
    raw = json.loads(json.dumps(BASE))
    raw["sources"]["shop"]["port"] = 13306
    assert parse_config(raw, env=env).source().endpoint.port == 13306


def test_a_missing_connection_says_how_to_provide_it():
    with pytest.raises(ConfigError, match="AIRFLOW_CONN_SHOP_DB"):
        parse_config(BASE, env={})


def test_environment_references_and_defaults():
    raw = {"sources": {"s": {"kind": "mysql", "host": "h", "port": "${PORT:-3306}", "user": "${USER_X}",
                             "password": "${PW:-}", "tables": ["a.b"]}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"}}
    cfg = parse_config(raw, env={"USER_X": "me"})
    assert (cfg.source().endpoint.port, cfg.source().endpoint.user) == (3306, "me")
    with pytest.raises(ConfigError, match="USER_X is not set"):
        parse_config(raw, env={})


@pytest.mark.parametrize("change, words", [
    (lambda r: r["sources"]["s"].update(kind="oracle"), "kind must be one of"),
    (lambda r: r["sources"]["s"].update(tables=["nodot"]), "namespace.table"),
    (lambda r: r["sources"]["s"].update(tables=["a.b; drop"]), "not a plain SQL identifier"),
    (lambda r: r["sources"]["s"].update(tables=[]), "list the tables"),
    (lambda r: r.update(dump={"chunk_size": 10, "chunk": 1}), "unknown field"),
    (lambda r: r.pop("storage"), "storage"),
    (lambda r: r["sources"]["s"].pop("port"), "missing field 'port'"),
    (lambda r: r.update(spark={"nice": 20}), "spark.nice must be an integer from 0 to 19"),
    (lambda r: r.update(spark={"nice": "low"}), "spark.nice must be"),
    (lambda r: r.update(spark={"nice": True}), "spark.nice must be"),
    (lambda r: r.update(spark={"executor_cores": 0}), "spark.executor_cores must be an integer >= 1"),
    (lambda r: r.update(spark={"executor_cores": "2"}), "spark.executor_cores must be"),
    (lambda r: r.update(spark={"executor_memory": "2 GB"}), "spark.executor_memory must look like"),
    (lambda r: r.update(spark={"conf": {"spark.master": "yarn"}}), "give the master as the spark section's"),
    (lambda r: r.update(spark={"conf": {"spark.submit.deployMode": "cluster"}}), "client mode only"),
    (lambda r: r["sources"]["s"].update(schema_changes="evolv"), "schema_changes: default: must be one of evolve"),
    (lambda r: r["sources"]["s"].update(schema_changes={"a.x": "ignore"}), "'a.x' is not one of the source's tables"),
    (lambda r: r["sources"]["s"].update(schema_changes={"a.b": "drop"}), "a.b: must be one of"),
    (lambda r: r["sources"]["s"].update(heartbeat_seconds=0), "heartbeat_seconds must be a number of seconds"),
    (lambda r: r["sources"]["s"].update(heartbeat_seconds="soon"), "heartbeat_seconds must be a number of seconds"),
    (lambda r: r["sources"]["s"].update(heartbeat_seconds=float("nan")), "heartbeat_seconds must be a number"),
    (lambda r: r["sources"]["s"].update(decoder="mysqlbinlog"), "decoder must be one of mysql-replication, mysql-event-stream"),
    (lambda r: r["sources"]["s"].update(kind="postgres", decoder="mysql-replication"), "only a mysql source has a binlog decoder"),
])
def test_bad_config_is_refused_with_what_is_wrong(change, words):
    raw = {"sources": {"s": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["a.b"]}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"}}
    change(raw)
    with pytest.raises(ConfigError, match=words):
        parse_config(raw, env={})


def test_cluster_settings_reach_the_spark_submit_command_line():
    """A cluster's settings from the YAML: the master, the executors' size and Python."""
    from airflow_provider_dblog.engine.jobs import spark_submit_args
    raw = json.loads(json.dumps(BASE))
    raw["spark"] = {"master": "spark://spark-master:7077", "executor_memory": "4g", "executor_cores": 2,
                    "python": "/opt/venvs/dblog/bin/python", "jars": []}
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_WH_DB": "postgres://u:p@h:2/d",
           "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0"}
    cmd = spark_submit_args(parse_config(raw, env=env), "/x/dump_job.py", ["--a"])
    assert cmd[cmd.index("--master") + 1] == "spark://spark-master:7077"
    assert cmd[cmd.index("--executor-memory") + 1] == "4g"
    assert cmd[cmd.index("--executor-cores") + 1] == "2"
    assert "spark.pyspark.python=/opt/venvs/dblog/bin/python" in cmd
    assert cmd.count("--master") == 1 and not any(c.startswith("spark.master=") for c in cmd)


def test_schema_changes_for_all_tables_or_per_table():
    raw = {"sources": {"s": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["a.b", "a.c"]}},
           "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"}}
    assert parse_config(raw, env={}).source().schema_changes_for("a.b") == "evolve"
    raw["sources"]["s"]["schema_changes"] = "lenient"
    assert parse_config(raw, env={}).source().schema_changes_for("a.c") == "lenient"
    raw["sources"]["s"]["schema_changes"] = {"default": "ignore", "a.c": "fail"}
    src = parse_config(raw, env={}).source()
    assert (src.schema_changes_for("a.b"), src.schema_changes_for("a.c")) == ("ignore", "fail")


def test_a_delta_target_takes_a_path_and_no_server():
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0"}
    raw = json.loads(json.dumps(BASE))
    raw["targets"] = {"lake": {"kind": "delta", "source": "shop", "path": "/data/lake"}}
    tgt = parse_config(raw, env=env).target()
    assert (tgt.kind, tgt.path, tgt.endpoint) == ("delta", "/data/lake", None)
    raw["targets"]["lake"].pop("path")
    with pytest.raises(ConfigError, match="delta target needs 'path'"):
        parse_config(raw, env=env)
    raw["targets"]["lake"] |= {"kind": "hudi", "path": "/x"}
    with pytest.raises(ConfigError, match="kind must be one of"):
        parse_config(raw, env=env)


def test_an_iceberg_target_takes_a_warehouse_path_and_its_catalog_server():
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0",
           "AIRFLOW_CONN_LAKE_CATALOG": "postgresql://cat:secret@pg:5432/catalog"}
    raw = json.loads(json.dumps(BASE))
    raw["targets"] = {"lake": {"kind": "iceberg", "source": "shop", "path": "/data/warehouse",
                               "conn_id": "lake_catalog", "schema": "cdc"}}
    tgt = parse_config(raw, env=env).target()
    assert (tgt.kind, tgt.path, tgt.schema) == ("iceberg", "/data/warehouse", "cdc")
    assert (tgt.endpoint.host, tgt.endpoint.port, tgt.endpoint.user, tgt.endpoint.database) == \
        ("pg", 5432, "cat", "catalog")
    assert "secret" not in repr(tgt)
    raw["targets"]["lake"].pop("path")
    with pytest.raises(ConfigError, match="iceberg target needs 'path'"):
        parse_config(raw, env=env)


def test_a_lake_target_may_keep_changelog_tables_and_a_sql_target_may_not():
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0",
           "AIRFLOW_CONN_WH_DB": "postgresql://u:p@h:5432/wh"}
    raw = json.loads(json.dumps(BASE))
    assert parse_config(raw, env=env).target().changelog is False   # off unless asked
    raw["targets"]["lake"] = {"kind": "delta", "source": "shop", "path": "/data/lake", "changelog": True}
    cfg = parse_config(raw, env=env)
    assert (cfg.target("lake").changelog, cfg.target("wh").changelog) == (True, False)
    raw["targets"]["lake"]["changelog"] = "yes"
    with pytest.raises(ConfigError, match=r"targets.lake.changelog: must be true or false, not 'yes'"):
        parse_config(raw, env=env)
    raw["targets"]["lake"]["changelog"] = False
    raw["targets"]["wh"]["changelog"] = True
    with pytest.raises(ConfigError, match="only a delta or iceberg target keeps changelog tables, not a postgres"):
        parse_config(raw, env=env)


def test_a_lake_target_on_an_object_store_takes_storage_options_from_the_environment():
    env = {"AIRFLOW_CONN_SHOP_DB": "mysql://u:p@h:1/d", "AIRFLOW_CONN_STATE_REDIS": "redis://r:6379/0",
           "AIRFLOW_CONN_WH_DB": "postgresql://u:p@h:5432/wh", "LAKE_SECRET": "s3cr3t"}
    raw = json.loads(json.dumps(BASE))
    raw["targets"]["lake"] = {"kind": "delta", "source": "shop", "path": "s3://bucket/lake",
                              "storage_options": {"AWS_SECRET_ACCESS_KEY": "${LAKE_SECRET}", "AWS_ALLOW_HTTP": True,
                                                  "timeout": 30}}
    lake = parse_config(raw, env=env, path="/etc/dblog/dblog.yaml").target("lake")
    assert lake.path == "s3://bucket/lake"   # a URI is not resolved beside the config
    assert dict(lake.storage_options) == {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ALLOW_HTTP": "true",
                                          "timeout": "30"}
    raw["targets"]["lake"]["storage_options"] = ["AWS_REGION=x"]
    with pytest.raises(ConfigError, match="targets.lake.storage_options: a mapping of option names to values"):
        parse_config(raw, env=env)
    raw["targets"]["lake"]["storage_options"] = {}
    raw["targets"]["wh"]["storage_options"] = {"AWS_REGION": "x"}
    with pytest.raises(ConfigError, match="targets.wh.storage_options: only a delta or iceberg target has them"):
        parse_config(raw, env=env)
