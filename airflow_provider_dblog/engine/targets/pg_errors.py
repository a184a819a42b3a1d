"""Which PostgreSQL errors mean "the server is away" (retry later) rather than "this is wrong".

Transient: the connection refused or cut (psycopg2 reports those without a SQLSTATE), a
SQLSTATE of class 08 (connection exception), and the server shutting down, crashing or
starting up (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now).
Everything else with a SQLSTATE (a type, a constraint, a missing table, a cancelled
statement) is a fault of the request: retrying would do the same again. A failed login
(a wrong password, a missing role or database) also comes without a SQLSTATE; it is told
by its message, so a typo in the config fails at once instead of after ``retry_for_s``.
"""
from __future__ import annotations

import psycopg2

TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
PERMANENT_CONNECT_ERRORS = ("authentication failed", "does not exist", "no pg_hba.conf entry",
                            "permission denied", "password")


def is_transient(error: BaseException) -> bool:
    if not isinstance(error, psycopg2.Error):
        return isinstance(error, (ConnectionError, TimeoutError))
    code = error.pgcode
    if code:
        return code.startswith("08") or code in TRANSIENT_SQLSTATES
    if isinstance(error, psycopg2.InterfaceError):  # "connection already closed"
        return True
    if isinstance(error, psycopg2.OperationalError) or type(error) is psycopg2.DatabaseError:
        text = str(error).lower()
        return not any(p in text for p in PERMANENT_CONNECT_ERRORS)
    return False
