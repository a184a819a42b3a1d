"""Credentials from the environment for the config (engine/config.py): ``${NAME}`` /
``${NAME:-default}`` in any value, and ``conn_id: NAME`` naming a connection in Airflow's
environment form ``AIRFLOW_CONN_<NAME>`` (a URI or JSON). Nothing here logs a value."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigError

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, where: str, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) in env:
                return env[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(f"{where}: environment variable {m.group(1)} is not set")
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}", env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", env) for i, v in enumerate(value)]
    return value


def conn_env_name(conn_id: str) -> str:
    return "AIRFLOW_CONN_" + conn_id.upper()


def connection_fields(conn_id: str, env: Mapping[str, str], where: str) -> dict:
    """host/port/user/password/database of ``AIRFLOW_CONN_<ID>`` (Airflow's URI or JSON form)."""
    text = env.get(conn_env_name(conn_id))
    if not text:
        raise ConfigError(f"{where}: connection {conn_id!r} not found: in Airflow, create it; "
                          f"outside Airflow, set {conn_env_name(conn_id)} (a URI or JSON)")
    if text.lstrip().startswith("{"):
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: {conn_env_name(conn_id)} is not valid JSON: {e.msg}") from None
        extra = d.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra or "{}")
        out = {"host": d.get("host"), "port": d.get("port"), "user": d.get("login"),
               "password": d.get("password"), "database": d.get("schema")}
    else:
        u = urlsplit(text)
        extra = dict(parse_qsl(u.query))
        out = {"host": unquote(u.hostname or "") or None, "port": u.port,
               "user": unquote(u.username) if u.username else None,
               "password": unquote(u.password) if u.password else None,
               "database": unquote(u.path.lstrip("/")) or None}
    if isinstance(extra, dict) and "url" in extra:
        out["url"] = extra["url"]
    return {k: v for k, v in out.items() if v not in (None, "")}


def _with_connection(d: dict, env: Mapping[str, str], where: str) -> dict:
    if not d.get("conn_id"):
        return d
    return connection_fields(str(d["conn_id"]), env, where) | {k: v for k, v in d.items() if k != "conn_id"}
