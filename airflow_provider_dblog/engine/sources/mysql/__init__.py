"""MySQL / MariaDB source: information_schema shapes, watermarks, key-range chunk
planning, bound-parameter key lookups and a binlog reader (mysql-replication).

- source.py: MySQLSource, the connections and the Source protocol
- sql.py: identifiers, literals and key-range predicates
- types.py: column types -> logical types, and how each column is selected
- convert.py: values -> logical values (``to_logical``)
- catalog.py: a table's shape from information_schema
- checks.py: binlog settings, privileges, values no target can hold
- ddl.py: what the binlog's statements (DDL, savepoints) do to captured tables (sqlglot)
- rows.py: binlog row images -> rows of logical values (RowConverter)
- captured.py: a captured table's shape, checked against an ALTER TABLE's result
- binlog.py: the binlog reader (BinlogReader)
- jdbc.py: Spark's JDBC URL, session and table expression

Nothing here imports Airflow.
"""
from __future__ import annotations

from .binlog import binlog_file_number
from .checks import binlog_problems, global_privileges, privilege_problems
from .convert import to_logical
from .ddl import read_statement
from .source import MySQLSource
from .sql import quote_ident, quote_table, sql_literal

__all__ = ["MySQLSource", "binlog_file_number", "binlog_problems",
           "global_privileges", "privilege_problems", "quote_ident", "quote_table", "read_statement",
           "sql_literal", "to_logical"]
