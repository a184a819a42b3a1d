"""The repair/backfill form: Airflow Params built from the config, and their parsing.

Every field is checked before anything touches the source: the table comes from a
dropdown of configured tables, keys are typed against the table's key columns, a
WHERE condition must be a plain condition (engine/conditions.py), sizes are bounded.
"""
from __future__ import annotations

import json
from typing import Any

from airflow.sdk import Param

from .engine.config import Config
from .engine.dump import SCOPES, DumpSpec

KEYS_HELP = ("One key per line; a composite key as comma-separated values in key order, e.g. "
             "'1001, 2'. Or a JSON list: [1, 2] or [[1001, 2], [1001, 3]].")
WHERE_HELP = ("A plain condition on the table's columns, e.g. status = 'new' AND total > 100. "
              "Allowed: =, <>, <, <=, >, >=, IN (...), BETWEEN .. AND .., LIKE, IS [NOT] NULL, "
              "AND, OR, NOT, parentheses. Values are bound as parameters.")


def repair_params(config: Config, source: str) -> dict[str, Param]:
    tables = list(config.source(source).tables)
    return {
        "scope": Param("table", enum=list(SCOPES), title="What to dump",
                       description="all: every configured table; table: one table; keys: a list of "
                                   "primary keys; where: the rows matching a condition",
                       values_display={"all": "All tables", "table": "One table",
                                       "keys": "A list of primary keys", "where": "Rows matching a condition"}),
        "table": Param(tables[0], enum=tables, title="Table", description="Not used when the scope is 'all'."),
        "keys": Param("", type="string", format="multiline", title="Primary keys", description=KEYS_HELP),
        "where": Param("", type="string", title="WHERE condition", description=WHERE_HELP),
        "chunk_size": Param(config.dump.chunk_size, type="integer", minimum=1, maximum=10_000_000,
                            title="Chunk size", description="Rows per chunk (one LW/HW window each)."),
        "parallelism": Param(config.dump.parallelism, type="integer", minimum=1, maximum=64,
                             title="Read parallelism", description="Spark JDBC partitions per chunk."),
    }


def parse_keys_text(text: Any) -> list:
    """Keys from the form: a JSON list, or one key per line with comma-separated values."""
    if isinstance(text, list):
        return text
    text = (text or "").strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            keys = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"the keys are not a valid JSON list: {e.msg} (line {e.lineno})") from None
        if not isinstance(keys, list):
            raise ValueError("the keys must be a JSON list")
        return keys
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if any(v == "" for v in values):
            raise ValueError(f"line {n} of the keys has an empty value: {line!r}")
        keys.append(values)
    return keys


def spec_from_params(params: dict) -> DumpSpec:
    """The dump request a form describes (the engine's validate_spec checks the rest)."""
    scope = params.get("scope")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    tables = [] if scope == "all" else [params.get("table")]
    keys = parse_keys_text(params.get("keys")) if scope == "keys" else []
    where = (params.get("where") or "").strip() if scope == "where" else None
    if scope != "keys" and (params.get("keys") or "").strip():
        raise ValueError(f"keys were given but the scope is {scope!r}: choose scope 'keys' or clear them")
    if scope != "where" and (params.get("where") or "").strip():
        raise ValueError(f"a WHERE condition was given but the scope is {scope!r}: choose scope "
                         "'where' or clear it")
    return DumpSpec(scope, tables, keys, params.get("chunk_size"), params.get("parallelism"), where)
