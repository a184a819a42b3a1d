"""A dump's chunk reader in this process: the SELECT that Spark's JDBC reader runs (over
the source's ``jdbc_table`` with the same key-range predicates), read with the source's
own connection and converted as its key-list selects are. For small dumps without a JVM
(the fuzzer, tests); the production path is Spark's (spark_jobs/common.py). Nothing here
imports Airflow."""
from __future__ import annotations

import pyarrow as pa

from .schema import TableSchema
from .sources.sql_source import quote_with


class LocalChunkReader:
    def __init__(self, source):
        self.source = source

    def read(self, table: TableSchema, predicates: list[str], dest_uri: str, keep_file: bool = True) -> pa.Table:
        src = self.source
        mark = "`" if src.config.kind == "mysql" else '"'
        names = ", ".join(quote_with(mark, c) for c in table.column_names)
        cols: dict[str, list] = {c: [] for c in table.column_names}
        for pred in predicates:
            # a predicate is SQL the source made from bound key values; % is not a parameter here
            sql = f"SELECT {names} FROM {src.jdbc_table(table)} WHERE {pred}".replace("%", "%%")
            src._append_rows(table, cols, src._query(sql, []))
        return src._arrow(table, cols)
