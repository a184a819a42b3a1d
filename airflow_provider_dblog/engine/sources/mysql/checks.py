"""Set-up checks of a MySQL/MariaDB source: the server's binlog settings, the
user's privileges (both pure, so they can be unit-tested) and values of a table
that no target can hold."""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import pymysql

from ...schema import TableSchema
from ..base import Problem
from .sql import quote_ident, quote_table
from .types import NativeColumn

_GRANT = re.compile(r"^\s*GRANT\s+(.+?)\s+ON\s+(\S+)\s+TO\s", re.I | re.S)
# the SHOW GLOBAL VARIABLES that binlog_problems reads (and the server's server_id)
SERVER_VARIABLES = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
                    "server_id", "log_bin_compress", "binlog_order_commits", "version")
# the oldest servers mysql-event-stream reads (its documented support)
EVENT_STREAM_SINCE = {"MARIADB": ("MariaDB", (10, 11)), "MYSQL": ("MySQL", (8, 4))}


def binlog_problems(variables: dict[str, Any], decoder: str = "mysql-replication") -> list[Problem]:
    """Problems with the server's binlog settings (SHOW GLOBAL VARIABLES, lower-case names)
    and, for ``decoder``, its version."""
    v = {k.lower(): ("" if x is None else str(x)).upper() for k, x in variables.items()}
    out = []
    if decoder == "mysql-event-stream" and v.get("version"):
        name, since = EVENT_STREAM_SINCE["MARIADB" if "MARIADB" in v["version"] else "MYSQL"]
        if tuple(int(x) for x in re.findall(r"\d+", v["version"])[:2]) < since:
            out.append(Problem(f"the server is {name} {variables.get('version')}: the binlog decoder "
                               f"mysql-event-stream reads {name} {'.'.join(map(str, since))} and later",
                               "set the source's decoder: mysql-replication (or upgrade the server)"))
    if v.get("log_bin") not in ("ON", "1"):
        out.append(Problem("the binary log is disabled (log_bin=OFF)",
                           "start the server with --log-bin (and a server-id) and restart it"))
        return out
    if v.get("binlog_format") != "ROW":
        out.append(Problem(f"binlog_format is {v.get('binlog_format') or 'unknown'}, not ROW",
                           "SET GLOBAL binlog_format=ROW and set binlog_format=ROW in the server "
                           "config (sessions started before keep their format)"))
    if v.get("binlog_row_image", "FULL") != "FULL":
        out.append(Problem(f"binlog_row_image is {v['binlog_row_image']}, not FULL",
                           "SET GLOBAL binlog_row_image=FULL and in the server config"))
    if v.get("binlog_order_commits") in ("OFF", "0"):
        out.append(Problem("binlog_order_commits is OFF: a transaction can become visible before "
                           "one logged ahead of it, so a chunk selected after its low watermark "
                           "could miss a change the log holds before it",
                           "SET GLOBAL binlog_order_commits=ON and in the server config"))
    if v.get("log_bin_compress") in ("ON", "1"):
        out.append(Problem("log_bin_compress is ON: compressed binlog events cannot be decoded, "
                           "their rows would be lost",
                           "SET GLOBAL log_bin_compress=OFF and in the server config"))
    if "binlog_row_metadata" in v and v["binlog_row_metadata"] != "FULL":
        out.append(Problem(f"binlog_row_metadata is {v['binlog_row_metadata']}, not FULL "
                           "(the binlog would carry no column names)",
                           "SET GLOBAL binlog_row_metadata=FULL and in the server config"))
    return out


def _split_privileges(text: str) -> list[str]:
    """``SELECT (a, b), INSERT`` -> ["SELECT", "INSERT"] (column lists dropped)."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [re.sub(r"\s*\(.*\)\s*$", "", p, flags=re.S).strip().upper() for p in out if p.strip()]


def global_privileges(grant_lines: Sequence[str]) -> set[str]:
    """Global (ON *.*) privileges named in SHOW GRANTS output; ALL PRIVILEGES -> {"ALL"}."""
    privs: set[str] = set()
    for line in grant_lines:
        m = _GRANT.match(line)
        if not m or m.group(2).replace("`", "") != "*.*":
            continue
        for p in _split_privileges(m.group(1)):
            p = " ".join(p.split())
            privs.add("ALL" if p in ("ALL", "ALL PRIVILEGES") else p)
    return privs


def privilege_problems(grant_lines: Sequence[str]) -> list[Problem]:
    privs = global_privileges(grant_lines)
    if "ALL" in privs:
        return []
    out = []
    if "REPLICATION SLAVE" not in privs and "REPLICATION REPLICA" not in privs:
        out.append(Problem("the user lacks the REPLICATION SLAVE privilege (needed to read the binlog)",
                           "GRANT REPLICATION SLAVE ON *.* TO <user>"))
    if not privs & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        out.append(Problem("the user lacks REPLICATION CLIENT / BINLOG MONITOR "
                           "(needed for SHOW MASTER STATUS)",
                           "GRANT REPLICATION CLIENT ON *.* TO <user> (MariaDB: BINLOG MONITOR)"))
    return out


def value_problems(query: Callable[[str], list[tuple]], table: str, schema: TableSchema,
                   native: dict[str, NativeColumn]) -> list[Problem]:
    """Values of the table that no target can hold exactly (one scan of the table):
    zero or invalid dates (unless zero_dates: null), NUL characters in text (a
    PostgreSQL target's text cannot hold them). Each would hold the table's apply."""
    checks = []   # (column, what its bad values are, predicate true for one, fix)
    for c in schema.columns:
        n, q = native[c.name], quote_ident(c.name)
        if n.data_type in ("date", "datetime", "timestamp") and not n.zero_as_null:
            checks.append((c.name, "zero or invalid dates ('0000-00-00', a zero month or day, "
                           "a day the month does not have)",
                           f"{q} IS NOT NULL AND COALESCE(YEAR({q}) = 0 OR MONTH({q}) = 0 OR "
                           f"DAYOFMONTH({q}) = 0 OR DAYOFMONTH(LAST_DAY({q})) < DAYOFMONTH({q}), 1)",
                           "UPDATE them to real dates or NULL, or set zero_dates: null for the "
                           "source (zero dates become NULL)"))
        elif c.type in ("string", "json") and n.data_type not in ("enum", "set"):
            checks.append((c.name, "NUL characters, which PostgreSQL text cannot hold",
                           f"INSTR({q}, CHAR(0)) > 0",
                           "remove the NUL characters, or make the column binary"))
    if not checks:
        return []
    sums = ", ".join(f"COALESCE(SUM({pred}), 0)" for _, _, pred, _ in checks)
    try:
        (counts,) = query(f"SELECT {sums} FROM {quote_table(table)}")
    except pymysql.MySQLError as e:
        return [Problem(f"cannot scan the table's values: {e}", "grant SELECT on the table", table)]
    return [Problem(f"{int(n):,} row(s) of column {name} hold {what}: no target holds them "
                    "exactly (the table's apply would stop before them)", fix, table)
            for (name, what, _, fix), n in zip(checks, counts) if int(n)]
