"""The PostgreSQL source (``PostgresSource``, source.py), by concern:

- source.py: the Source itself (connections, chunks, key selects, Spark JDBC, the log's entry points)
- catalog.py: table shapes from pg_catalog; column_types.py: PostgreSQL types -> logical types
  and the one form each value is read in; sql.py: quoting, literals, key predicates
- checks.py: set-up checks; watermarks.py: the watermark table and its writes
- slot.py: the replication slot and publication; stream.py: the replication connection;
  changes.py: transactions assembled from its messages; row_images.py: their rows and keys
- pgoutput.py: the protocol decoder, pgoutput_messages.py its messages, text_values.py
  values by type OID, relation_cache.py generic tuple -> dict reading
- lsn.py: LSN text <-> int

Nothing here imports Airflow.
"""
from .lsn import int_to_lsn, lsn_to_int
from .source import PostgresSource
from .sql import quote_ident, quote_table

__all__ = ["PostgresSource", "int_to_lsn", "lsn_to_int", "quote_ident", "quote_table"]
