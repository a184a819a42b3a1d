"""DBLogHook: the engine's config, with credentials from Airflow connections.

The config is the same YAML the ``dblog`` command reads. Its sources, targets
and state may name Airflow connections (``conn_id: ...``); the hook looks them up
through Airflow and gives them to the engine, and to the Spark jobs it starts,
in Airflow's own ``AIRFLOW_CONN_<ID>`` form, so no secret is written anywhere.
``DBLogHookMixin`` gives the operators and sensors the hook from their arguments.
"""
from __future__ import annotations

import os
from functools import cached_property

from airflow.sdk import BaseHook

from ..engine.config import Config, conn_env_name, load_config, referenced_conn_ids
from ..exceptions import DBLogConfigNotFound

CONFIG_ENV = "DBLOG_CONFIG"


class DBLogHook(BaseHook):
    """Builds the engine's parts (source, Redis state, event store, dump runner, target)
    from a dblog config file.

    :param config_path: the YAML config; default: the connection's ``config_path``
        extra, else ``$DBLOG_CONFIG``.
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    """

    conn_name_attr = "dblog_conn_id"
    default_conn_name = "dblog_default"
    conn_type = "dblog"
    hook_name = "DBLog"

    def __init__(self, config_path: str | None = None, dblog_conn_id: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config_path = config_path
        self.dblog_conn_id = dblog_conn_id

    # -- config ----------------------------------------------------------------
    def resolve_config_path(self) -> str:
        path = self.config_path
        if not path and self.dblog_conn_id:
            conn = self.get_connection(self.dblog_conn_id)
            extra = conn.extra_dejson
            # the UI stores the field as ``config_path``; older forms used the prefixed name
            path = extra.get("config_path") or extra.get(f"extra__{self.conn_type}__config_path") or conn.host
        path = path or os.environ.get(CONFIG_ENV)
        if not path:
            raise DBLogConfigNotFound(
                f"no dblog config: pass config_path, set config_path on a 'dblog' connection, "
                f"or set ${CONFIG_ENV}")
        if not os.path.exists(path):
            raise DBLogConfigNotFound(f"dblog config {path} does not exist on this worker")
        return path

    @cached_property
    def connection_env(self) -> dict[str, str]:
        """``AIRFLOW_CONN_<ID>`` for every connection the config names, as JSON."""
        env = {}
        for conn_id in referenced_conn_ids(self.resolve_config_path()):
            name = conn_env_name(conn_id)
            if name in os.environ:  # defined in the environment already: the same thing Airflow reads
                env[name] = os.environ[name]
            else:
                env[name] = self.get_connection(conn_id).as_json()
        return env

    @cached_property
    def config(self) -> Config:
        return load_config(self.resolve_config_path(), env={**os.environ, **self.connection_env})

    def subprocess_env(self) -> dict[str, str]:
        """The environment a Spark job needs: the resolved connections and a local Spark."""
        from ..engine.jobs import job_env
        return {**job_env(), **self.connection_env}

    # -- engine parts ----------------------------------------------------------
    def wiring(self, source: str | None = None):
        """The engine's parts of a source (``engine.wiring``)."""
        from ..engine.wiring import Wiring
        return Wiring(self.config, source)

    def source(self, name: str | None = None):
        return self.wiring(name).open_source()

    def state(self, source: str | None = None):
        return self.wiring(source).state

    def store(self, source: str | None = None):
        return self.wiring(source).store

    def runner(self, source: str | None = None, reader=None):
        return self.wiring(source).runner(reader)

    def target(self, name: str | None = None):
        from ..engine.targets import open_target
        return open_target(self.config.target(name))

    def test_connection(self) -> tuple[bool, str]:
        try:
            cfg = self.config
            problems = [f"{s}: {p}" for s in cfg.sources for p in self.source(s).check()]
        except Exception as e:  # the UI shows the message
            return False, f"{type(e).__name__}: {e}"
        return (not problems, "; ".join(problems) or f"{len(cfg.sources)} source(s) ready for CDC")


class DBLogHookMixin:
    """For the operators and sensors that read the dblog config: the arguments that name
    it (``config_path``, ``dblog_conn_id``) and the hook built from them. Put it before
    the Airflow base class (``class X(DBLogHookMixin, BaseOperator)``)."""

    config_path: str | None
    dblog_conn_id: str | None

    def use_dblog_config(self, config_path: str | None, dblog_conn_id: str | None, source: str | None) -> None:
        """Keep the arguments naming the config and the source in it (from ``__init__``;
        ``config_path`` is templated, so the hook is built only when the task runs)."""
        self.config_path = config_path
        self.dblog_conn_id = dblog_conn_id
        self.source = source

    def dblog_hook(self) -> DBLogHook:
        """A hook on the config as the running task sees it."""
        return DBLogHook(config_path=self.config_path, dblog_conn_id=self.dblog_conn_id)
