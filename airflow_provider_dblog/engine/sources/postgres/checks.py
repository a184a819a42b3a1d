"""What keeps a PostgreSQL source from CDC, each with its fix (``dblog check``, and a
tail's start): server settings, the user's role, the watermark table, each captured
table (existence, primary key, column types, REPLICA IDENTITY FULL, SELECT grant,
optionally values no target can hold) and the slot and publication.

Nothing here imports Airflow.
"""
from __future__ import annotations

from typing import Any

import psycopg2

from ...errors import SourceSetupError
from ..base import Problem
from ..sql_source import driver_text
from .sql import bound_ident, quote_table, table_stmt

# the pg_settings that server_problems and check read
CHECKED_SETTINGS = ("wal_level", "max_replication_slots", "max_wal_senders", "synchronous_standby_names")


def server_problems(settings: dict[str, Any]) -> list[Problem]:
    """Problems with the server's settings (pg_settings names, lower case)."""
    s = {k.lower(): ("" if v is None else str(v)).strip().lower() for k, v in settings.items()}
    out = []
    if s.get("wal_level") != "logical":
        out.append(Problem(f"wal_level is {s.get('wal_level') or 'unknown'}, not logical",
                           "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
    for name in ("max_replication_slots", "max_wal_senders"):
        if name in s and s[name].isdigit() and int(s[name]) < 1:
            out.append(Problem(f"{name} is {s[name]}: no logical replication connection is possible",
                               f"ALTER SYSTEM SET {name} = 10; then restart PostgreSQL"))
    return out


def role_problems(rolreplication: bool, rolsuper: bool) -> list[Problem]:
    if rolreplication or rolsuper:
        return []
    return [Problem("the user lacks the REPLICATION attribute (needed for a replication slot "
                    "and to read the WAL)", "ALTER ROLE <user> REPLICATION")]


class SetupChecks:
    """PostgresSource's checks (a mixin: it queries through the source)."""

    def server_settings(self) -> dict[str, str]:
        rows = self._query("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                           (list(CHECKED_SETTINGS),))
        return {str(k).lower(): str(v) for k, v in rows}

    def unreachable(self, error: Exception) -> Problem:
        ep = self.config.endpoint
        return Problem(f"cannot connect to {ep.host}:{ep.port}/{ep.database} as {ep.user}: {driver_text(error)}",
                       "check the host, port, user, password and database of the source")

    def setup_problems(self, settings: dict[str, str]) -> list[Problem]:
        """The server's settings and the user's role (and what synchronous standbys need)."""
        problems = server_problems(settings)
        rows = self._query("SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user")
        problems += role_problems(*rows[0]) if rows else role_problems(False, False)
        if settings.get("synchronous_standby_names") and not (rows and rows[0][1]):
            (stats,), = self._query("SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')")
            if not stats:
                problems.append(Problem(
                    "synchronous standbys are configured, and the user cannot see other sessions' "
                    "waits: a commit in the log but not yet visible (waiting for a standby) would "
                    "not be awaited by the watermarks, and a chunk could miss it",
                    "GRANT pg_read_all_stats TO <user>"))
        return problems

    def probe_watermark_write(self) -> None:
        self._query(table_stmt("UPDATE ", self.watermark_table, " SET value = value WHERE id = 1 AND false"),
                    fetch=False)

    def watermark_grant(self) -> str:
        return (f"GRANT CREATE ON DATABASE <db> TO <user> (the engine creates schema {self.namespace}), "
                f"or create {self.watermark_table} and GRANT SELECT, INSERT, UPDATE on it")

    def capture_problems(self, table: str) -> list[Problem]:
        if self._replident.get(table) == "f":
            return []
        ident = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}.get(self._replident.get(table, ""), "unknown")
        return [Problem(f"REPLICA IDENTITY is {ident}, not FULL: the WAL would lack the before image "
                        "of updates and deletes (needed for key changes and deletes)",
                        f"ALTER TABLE {quote_table(table)} REPLICA IDENTITY FULL", table)]

    def probe_select(self, table: str) -> None:
        self._query(table_stmt("SELECT 1 FROM ", table, " LIMIT 0"))

    def log_problems(self) -> list[Problem]:
        try:
            return self.slot.problems()
        except SourceSetupError as e:   # a bad slot or publication name
            return [Problem(str(e), "fix the `slot:` / `publication:` of the source")]
        except psycopg2.Error as e:
            return [Problem(f"cannot read the replication slots and publications: {driver_text(e)}",
                            "grant pg_read_all_stats to the user")]

    def value_problems(self, table: str) -> list[Problem]:
        """Values of the table that no target can hold exactly (one scan of the table):
        timestamps past Arrow's 64-bit microsecond range (years after 294246; PostgreSQL's
        own range starts at 4713 BC, well inside it; ±infinity are carried). Each would
        hold the table's apply."""
        schema = self.table_schema(table)
        native = self.native_columns(table)
        cols = [c.name for c in schema.columns if native[c.name].type_name in ("timestamp", "timestamptz")]
        if not cols:
            return []
        sums = ", ".join(
            f"count(*) FILTER (WHERE isfinite({bound_ident(c)}) AND {bound_ident(c)} >= '294247-01-01')" for c in cols)
        try:
            (counts,) = self._query(table_stmt(f"SELECT {sums} FROM ", table))
        except psycopg2.Error as e:
            return [Problem(f"cannot scan the table's values: {str(e).strip()}",
                            "grant SELECT on the table", table)]
        return [Problem(f"{int(n):,} row(s) of column {c} hold timestamps past year 294246: no "
                        "target holds them exactly (the table's apply would stop before them)",
                        "UPDATE them to infinity or a nearer date", table)
                for c, n in zip(cols, counts) if int(n)]
