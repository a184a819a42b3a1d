"""ENUM / SET labels the catalog prints with '?' (information_schema is utf8mb3: each character
outside the BMP prints as one '?'): the true labels read from the server (catalog._true_labels),
and what stays loud when they cannot be. On the real MariaDB:
tests/integration/test_mysql_wide_labels.py and test_mes_break.py."""
from __future__ import annotations

from types import SimpleNamespace

import pymysql
import pytest

from airflow_provider_dblog.engine.sources.mysql.captured import _logged_problem
from airflow_provider_dblog.engine.sources.mysql.catalog import _true_labels
from airflow_provider_dblog.engine.sources.mysql.convert import key_sql_value
from airflow_provider_dblog.engine.sources.mysql.types import NativeColumn, prints_as

CLEF, GRIN = "\U0001d11e", "\U0001f600"


def _enum(labels, charset="utf8mb4", kind="enum") -> NativeColumn:
    return NativeColumn("e", kind, f"{kind}(...)", "string", set_values=tuple(labels), charset=charset)


@pytest.mark.parametrize("label, printed, alike", [
    (CLEF, "?", True), ("?", "?", True), (f"a{CLEF}b{GRIN}", "a?b?", True), ("\u00e9", "?", False),
    ("\uffff", "?", False), (CLEF + CLEF, "?", False), ("?", "??", False), ("a", "b", False)])
def test_a_label_prints_as_itself_with_one_question_mark_per_character_outside_the_bmp(label, printed, alike):
    assert prints_as(label, printed) is alike


def _hex(*labels: str) -> list[tuple]:
    return [tuple(v.encode().hex().upper() for v in labels)]


def test_the_labels_printed_with_a_question_mark_are_read_from_the_server():
    asked = []
    native = {"e": _enum(["a", "?", "?", "x?"]), "s": _enum(["p", "?"], kind="set"),
              "m": _enum(["?"], charset="utf8mb3")}   # utf8mb3 holds nothing outside the BMP: '?' is '?'

    def query(sql, args=None):
        asked.append(sql)
        return _hex(CLEF, "?", f"x{GRIN}", GRIN)
    assert _true_labels(query, "d`b.t", native)
    assert native["e"].set_values == ("a", CLEF, "?", f"x{GRIN}") and native["s"].set_values == ("p", GRIN)
    assert native["m"].set_values == ("?",)
    (sql,) = asked   # one block: an ENUM's index, a SET's bit, of a variable of the column's type
    assert "TYPE OF `d``b`.`t`.`e` DEFAULT 2;" in sql and "TYPE OF `d``b`.`t`.`s` DEFAULT 2;" in sql
    assert "DEFAULT 4;" in sql and "`m`" not in sql


def test_no_question_mark_no_read():
    native = {"e": _enum(["a", CLEF])}
    assert _true_labels(lambda *a: pytest.fail("read"), "d.t", native) and native["e"].set_values == ("a", CLEF)


def test_a_label_read_that_the_catalog_did_not_print_is_a_change_meanwhile():
    native = {"e": _enum(["a", "?"])}
    assert not _true_labels(lambda *a: _hex("b"), "d.t", native)   # read again (catalog.read_table)
    assert native["e"].set_values == ("a", "?")


def test_a_server_that_cannot_say_leaves_the_printed_labels_and_the_log_breaks_the_table_loud():
    native = {"e": _enum(["?", "?"])}

    def query(sql, args=None):
        raise pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax")
    assert _true_labels(query, "d.t", native) and native["e"].set_values == ("?", "?")
    problem = _logged_problem(native["e"], SimpleNamespace(type=247, enum_values=["", CLEF, "?"]))
    assert "outside the BMP" in problem and repr([CLEF, "?"]) in problem
    assert "outside the BMP" not in _logged_problem(native["e"], SimpleNamespace(type=247, enum_values=["", "?", "b"]))
    # a key label the printed ones cannot tell apart is no chunk bound (its number is not known)
    with pytest.raises(ValueError, match="not a value"):
        key_sql_value(native["e"], "?")
    assert key_sql_value(native["e"], "?", exact=False) == -1
    s = _enum(["p", "?", "?"], kind="set")
    with pytest.raises(ValueError):
        key_sql_value(s, "p,?")
    assert key_sql_value(s, "p") == 1 and key_sql_value(_enum(["?", CLEF]), "?") == 1
