"""The repair/backfill form: Airflow Params built from the config, and their parsing.

Every field is checked before anything touches the source: the table comes from a
dropdown of configured tables, keys are typed against the table's key columns, a
WHERE condition must be a plain condition (engine/conditions.py), sizes are bounded.
"""
from __future__ import annotations


from airflow.sdk import Param

from .engine.config import Config
from .engine.requests import SCOPES, DumpSpec, parse_spec

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
        # optional fields allow null: Airflow's form requires every field whose type refuses it
        "keys": Param(None, type=["null", "string"], format="multiline", title="Primary keys",
                      description="For the scope 'keys'. " + KEYS_HELP),
        "where": Param(None, type=["null", "string"], title="WHERE condition",
                       description="For the scope 'where'. " + WHERE_HELP),
        "chunk_size": Param(config.dump.chunk_size, type="integer", minimum=1, maximum=10_000_000,
                            title="Chunk size", description="Rows per chunk (one LW/HW window each)."),
        "parallelism": Param(config.dump.parallelism, type="integer", minimum=1, maximum=64,
                             title="Read parallelism", description="Spark JDBC partitions per chunk."),
    }


def spec_from_params(params: dict) -> DumpSpec:
    """The dump request a form describes (``engine.requests.parse_spec``, the rules of every
    front end; ``validate_spec`` checks the rest). The form's table dropdown always holds a
    table: it is not used when the scope is 'all'."""
    scope = params.get("scope")
    return parse_spec(scope, None if scope == "all" else params.get("table"), params.get("keys"),
                      params.get("where"), params.get("chunk_size"), params.get("parallelism"))


def verify_params(config: Config, source: str) -> dict[str, Param]:
    """The verification form (``dblog_verify__<source>``): what to compare (the repair form's
    scope, table, keys and condition) and whether to repair what differs."""
    fields = repair_params(config, source)
    fields["scope"] = Param("all", enum=list(SCOPES), title="What to verify",
                            description="all: every configured table; table: one table; keys: a list of "
                                        "primary keys; where: the rows matching a condition",
                            values_display={"all": "All tables", "table": "One table",
                                            "keys": "A list of primary keys", "where": "Rows matching a condition"})
    return {k: fields[k] for k in ("scope", "table", "keys", "where")} | {
        "repair": Param(False, type="boolean", title="Repair",
                        description="Dump, apply and verify again exactly the keys that differ.")}
