"""The dblog config, loaded in the triggerer without blocking its event loop."""
from __future__ import annotations

import asyncio
import os

from ..engine.config import Config


async def load_config_async(config_path: str) -> Config:
    """The config, with the Airflow connections it names resolved through the Task SDK's
    async connection access (the file is read in a thread)."""
    from ..engine.config import conn_env_name, load_config, referenced_conn_ids

    env = dict(os.environ)
    for conn_id in await asyncio.to_thread(referenced_conn_ids, config_path):
        name = conn_env_name(conn_id)
        if name not in env:
            from airflow.sdk import BaseHook
            conn = await BaseHook.aget_connection(conn_id)
            env[name] = conn.as_json()
    return await asyncio.to_thread(load_config, config_path, env)
