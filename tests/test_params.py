"""A dump request from what users type: the repair form, the dblog command and the create-dump
operator all go through ``engine.requests.parse_spec`` (the engine validates keys against the
table and conditions after it), so each takes the same syntaxes with the same rules."""
from __future__ import annotations

import pytest

from airflow_provider_dblog.cli import _spec_from_args, build_parser
from airflow_provider_dblog.engine.config import parse_config
from airflow_provider_dblog.engine.errors import ConfigError, InvalidKeyError
from airflow_provider_dblog.engine.requests import parse_keys, parse_spec
from airflow_provider_dblog.exceptions import DBLogInvalidRequest
from airflow_provider_dblog.operators.dump import DBLogCreateDumpOperator
from airflow_provider_dblog.params import repair_params, spec_from_params

CFG = parse_config({"sources": {"shop": {"kind": "mysql", "host": "h", "port": 1, "user": "u",
                                         "tables": ["shop.orders", "shop.items"]}},
                    "state": {"redis_url": "redis://r"}, "storage": {"root": "/tmp"},
                    "dump": {"chunk_size": 5000, "parallelism": 3}}, env={})


def test_form_offers_the_configured_tables_and_defaults():
    p = repair_params(CFG, "shop")
    assert p["table"].schema["enum"] == ["shop.orders", "shop.items"]
    assert p["scope"].schema["enum"] == ["all", "table", "keys", "where"]
    assert p["chunk_size"].value == 5000 and p["parallelism"].value == 3
    assert p["chunk_size"].schema["minimum"] == 1


@pytest.mark.parametrize("value, keys", [
    ("1\n2\n\n3", [["1"], ["2"], ["3"]]),
    ("1001, 2\n1001,3", [["1001", "2"], ["1001", "3"]]),
    ("[1, 2]", [1, 2]),
    ('[[1001, "a"]]', [[1001, "a"]]),
    ("[[1001, 'a']]", [[1001, "a"]]),        # a list param a template rendered as Python text
    ([[1, "a"], [2, "b"]], [[1, "a"], [2, "b"]]),
    ('{"a": 1}', [['{"a": 1}']]),           # one key per line: a text key, typed by validate_spec
    ("", []), (None, []), ("None", []),
])
def test_key_syntaxes(value, keys):
    assert parse_keys(value) == keys


@pytest.mark.parametrize("value, words", [
    ("[1, 2", "not a valid JSON list"),
    ("1,\n2", "line 1 of the keys has an empty value"),
    ({"a": 1}, "must be a list of primary keys, not dict"),
    (7, "must be a list of primary keys, not int"),
])
def test_bad_keys_say_what_is_wrong(value, words):
    with pytest.raises(InvalidKeyError, match=words):
        parse_keys(value)


@pytest.mark.parametrize("fields, words", [
    ({"scope": "everything"}, "scope must be one of"),
    ({"scope": "table"}, "scope 'table' needs a table"),
    ({"scope": "all", "table": "shop.orders"}, "leave the table empty"),
    ({"scope": "table", "table": "shop.orders", "keys": "1"}, "keys were given but the scope is 'table'"),
    ({"scope": "keys", "table": "shop.orders", "keys": "1", "where": "id = 1"}, "WHERE condition was given"),
    ({"scope": "where", "table": "shop.orders"}, "needs a condition"),
    ({"scope": "table", "table": "shop.orders", "chunk_size": "ten"}, "chunk_size must be an integer"),
])
def test_mismatched_fields_are_refused(fields, words):
    with pytest.raises(ConfigError, match=words):
        parse_spec(**fields)


def test_the_form_can_be_submitted_with_its_defaults():
    """Airflow's form marks a field required when its JSON schema refuses null, and refuses
    to trigger until it is filled: the optional fields must allow null."""
    from airflow.sdk.definitions.param import ParamsDict
    params = ParamsDict(repair_params(CFG, "shop"))
    values = params.validate()   # what Airflow runs before it creates the run
    assert values["keys"] is None and values["where"] is None
    for name in ("keys", "where"):
        assert "null" in params.get_param(name).schema["type"]
    assert spec_from_params(values).tables == ["shop.orders"]           # the defaults: one table
    assert spec_from_params(values | {"scope": "all"}).tables == []     # one field changed: all tables
    keys = spec_from_params(values | {"scope": "keys", "keys": "7"})
    assert keys.keys == [["7"]]


def test_the_form_ignores_its_table_dropdown_for_all_tables():
    assert spec_from_params({"scope": "all", "table": "shop.orders", "keys": "", "where": ""}).tables == []


CASES = [  # (the form's fields, the dblog command's arguments)
    ({"scope": "all"}, ["--all"]),
    ({"scope": "table", "table": "shop.orders", "chunk_size": 10}, ["--table", "shop.orders", "--chunk-size", "10"]),
    ({"scope": "keys", "table": "shop.orders", "keys": "1001, 2\n1002, 3"},
     ["--table", "shop.orders", "--keys", "1001, 2\n1002, 3"]),
    ({"scope": "keys", "table": "shop.orders", "keys": '[[1001, "a"], [1002, "b"]]'},
     ["--table", "shop.orders", "--keys", '[[1001, "a"], [1002, "b"]]']),
    ({"scope": "where", "table": "shop.orders", "where": "status = 'new'", "parallelism": 2},
     ["--table", "shop.orders", "--where", "status = 'new'", "--parallelism", "2"]),
]


@pytest.mark.parametrize("fields, argv", CASES)
def test_every_front_end_reads_the_same_request(fields, argv):
    """The same input gives the same request through the form, the command and the operator."""
    form = {"table": "shop.orders", "keys": "", "where": "", "chunk_size": None, "parallelism": None} | fields
    from_form = spec_from_params(form)
    from_cli = _spec_from_args(build_parser().parse_args(["--config", "x.yaml", "dump", *argv]))
    from_operator = DBLogCreateDumpOperator(task_id="c", **{k: v for k, v in fields.items()}).build_spec()
    assert from_form == from_cli == from_operator, (from_form, from_cli, from_operator)


def test_the_operator_reports_a_bad_request_as_its_own_error():
    with pytest.raises(DBLogInvalidRequest, match="needs a table"):
        DBLogCreateDumpOperator(task_id="c", scope="keys", keys="1").build_spec()
