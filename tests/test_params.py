"""The repair form's parsing (the engine validates keys and conditions after it)."""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.config import parse_config
from airflow_provider_dblog.params import parse_keys_text, repair_params, spec_from_params

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


@pytest.mark.parametrize("text, keys", [
    ("1\n2\n\n3", [["1"], ["2"], ["3"]]),
    ("1001, 2\n1001,3", [["1001", "2"], ["1001", "3"]]),
    ("[1, 2]", [1, 2]),
    ('[[1001, "a"]]', [[1001, "a"]]),
    ("", []),
])
def test_keys_text(text, keys):
    assert parse_keys_text(text) == keys


@pytest.mark.parametrize("text, words", [("[1, 2", "not a valid JSON list"), ("1,\n2", "empty value"),
                                         ('{"a": 1}', None)])
def test_bad_keys_text(text, words):
    if words is None:  # a JSON object is not a list and not the line form either
        with pytest.raises(ValueError):
            parse_keys_text("[" + text)
        return
    with pytest.raises(ValueError, match=words):
        parse_keys_text(text)


def test_spec_from_params_and_mismatches():
    spec = spec_from_params({"scope": "keys", "table": "shop.orders", "keys": "1\n2", "where": "",
                             "chunk_size": 10, "parallelism": 2})
    assert (spec.scope, spec.tables, spec.keys, spec.chunk_size) == ("keys", ["shop.orders"], [["1"], ["2"]], 10)
    assert spec_from_params({"scope": "all", "table": "shop.orders"}).tables == []
    with pytest.raises(ValueError, match="scope is 'table'"):
        spec_from_params({"scope": "table", "table": "shop.orders", "keys": "1"})
    with pytest.raises(ValueError, match="WHERE condition was given"):
        spec_from_params({"scope": "keys", "table": "shop.orders", "keys": "1", "where": "id = 1"})
    with pytest.raises(ValueError, match="scope must be one of"):
        spec_from_params({"scope": "everything"})
