"""What Spark's JDBC reader needs to read chunks of a MySQL/MariaDB table the way
the binlog decodes them: the URL and session (``jdbc_connection``) and the table
expression (``jdbc_table``)."""
from __future__ import annotations

from ...config import Endpoint
from ...schema import TableSchema
from ..sql_source import raw_key_alias
from .sql import quote_ident, quote_table
from .types import NativeColumn, needs_expr, select_expr

JDBC_DRIVER = "org.mariadb.jdbc.Driver"
# the session the JDBC reader gets: no NO_BACKSLASH_ESCAPES (range predicates
# escape backslashes), ANSI_QUOTES in case a dialect quotes with ", and UTC so
# TIMESTAMP columns read as the binlog decodes them
JDBC_SQL_MODE = "ANSI_QUOTES,STRICT_TRANS_TABLES"
SESSION_TIME_ZONE = "+00:00"   # of every session, pymysql's too


def jdbc_connection(ep: Endpoint) -> tuple[str, dict[str, str]]:
    """URL and properties for spark.read.jdbc with MariaDB Connector/J 2.7.

    Verified with Spark 4.2 (local[2], JVM and session time zone America/New_York):
    chunk rows read through jdbc_table + range_predicates equal select_keys.

    - ``jdbc:mysql:`` makes Spark use its MySQL dialect (backtick quoting); the
      MariaDB driver accepts that scheme (``jdbc:mariadb:`` would make Spark
      quote with ``"``).
    - Driver options go in the URL (2.7 ignored some of them as properties):
      tinyInt1isBit=false keeps TINYINT(1) an integer, yearIsDateType=false,
      and serverTimezone=UTC + useLegacyDatetimeCode=false read DATETIME and
      TIMESTAMP as UTC wall-clock, the way the binlog decodes them, whatever
      the JVM's time zone.
    - sessionVariables: a known sql_mode without NO_BACKSLASH_ESCAPES (the
      literals of range_predicates escape backslashes) and a UTC session.
    - preferTimestampNTZ: DATETIME columns read as TIMESTAMP_NTZ.
    """
    options = {"tinyInt1isBit": "false", "yearIsDateType": "false",
               "useLegacyDatetimeCode": "false", "serverTimezone": "UTC"}
    url = (f"jdbc:mysql://{ep.host}:{int(ep.port)}/?"
           + "&".join(f"{k}={v}" for k, v in options.items()))
    props = {
        "driver": JDBC_DRIVER,
        "user": ep.user,
        "password": ep.password,
        "sessionInitStatement": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "sessionVariables": f"sql_mode='{JDBC_SQL_MODE}',time_zone='{SESSION_TIME_ZONE}'",
        "fetchsize": "10000",
        "preferTimestampNTZ": "true",
    }
    return url, props


def jdbc_table(schema: TableSchema, native: dict[str, NativeColumn]) -> str:
    """spark.read.jdbc's ``table``: a derived table of the quoted table naming every column
    (``SELECT *`` leaves out an INVISIBLE column; a column read through an expression is
    selected as select_expr gives it). A key column read through an expression is also
    selected raw as ``raw_key_alias(name)``, which range predicates use: MariaDB merges the
    derived table, so the predicates stay range scans on the primary key. Select
    ``table.column_names`` from the result (the aliases are extra columns)."""
    exprs = [select_expr(native[c]) for c in schema.column_names]
    exprs += [f"{quote_ident(k)} AS {quote_ident(raw_key_alias(k))}"
              for k in schema.key if needs_expr(native[k])]
    return (f"(SELECT {', '.join(exprs)} FROM {quote_table(schema.qualified)}) "
            "AS `dblog_chunk`")
