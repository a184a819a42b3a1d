"""The WHERE conditions a user may type in the repair form: parsed strictly, bound."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from airflow_provider_dblog.engine.conditions import ConditionError, parse_condition
from airflow_provider_dblog.engine.schema import Column, TableSchema

ORDERS = TableSchema("shop", "orders", (
    Column("id", "int64", False), Column("status", "string"), Column("total", "decimal(12,2)"),
    Column("placed_at", "timestamp"), Column("note", "string"), Column("qty", "int32")), ("id",))


def q(name: str) -> str:
    return "`" + name + "`"


@pytest.mark.parametrize("text, sql, params", [
    ("status = 'new'", "`status` = %s", ("new",)),
    ("status != 'it''s'", "`status` <> %s", ("it's",)),
    ("total >= 10.5 AND qty < 3", "(`total` >= %s AND `qty` < %s)", (Decimal("10.50"), 3)),
    ("id IN (1, 2, 3)", "`id` IN (%s, %s, %s)", (1, 2, 3)),
    ("id NOT IN (4)", "`id` NOT IN (%s)", (4,)),
    ("placed_at BETWEEN '2025-01-01' AND '2025-02-01 10:00:00'", "`placed_at` BETWEEN %s AND %s",
     (dt.datetime(2025, 1, 1), dt.datetime(2025, 2, 1, 10))),
    ("note IS NULL OR note LIKE 'x%'", "(`note` IS NULL OR `note` LIKE %s)", ("x%",)),
    ("note is not null and (status = 'a' or status = 'b')",
     "(`note` IS NOT NULL AND ((`status` = %s OR `status` = %s)))", ("a", "b")),
    ("NOT qty = 1", "NOT `qty` = %s", (1,)),
])
def test_plain_conditions_become_bound_sql(text, sql, params):
    cond = parse_condition(ORDERS, text, q)
    assert cond.sql == sql
    assert cond.params == params


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("1 = 1", "expected word"),
    ("status = 'a'; DROP TABLE orders", "unexpected ';'"),
    ("status = 'a' -- comment", "unexpected '-'"),
    ("status = (SELECT 1)", "expected a number or a 'quoted string'"),
    ("sleep(5) = 0", "has no column 'sleep'"),
    ("nope = 1", "has no column 'nope'"),
    ("id = 'abc'", "not an integer"),
    ("total = 1.234", "decimal places"),
    ("status = 'a' OR", "expected word but found the end"),
    ("id = other_col", "expected a number or a 'quoted string'"),
    ("id LIKE '1%'", "LIKE needs a text column"),
    ("status", "expected an operator"),
    ("status = 'a' status = 'b'", "unexpected 'status'"),
    ("id IN ()", "expected a number"),
    ("x" * 2001, "longer than"),
    ("status = \"a\"", "unexpected '\"'"),
    ("placed_at = '2025-01-01T00:00:00+02:00'", "time zone"),
])
def test_anything_else_is_refused_with_a_clear_message(text, words):
    with pytest.raises(ConditionError) as info:
        parse_condition(ORDERS, text, q)
    assert words in str(info.value)
