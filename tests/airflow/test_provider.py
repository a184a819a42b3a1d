"""The provider is discoverable the way Airflow discovers providers."""
from __future__ import annotations

import importlib
import importlib.metadata

import pytest

import airflow_provider_dblog


def _listed_modules(info: dict) -> list[str]:
    mods = []
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info.get(section, []):
            mods += entry["python-modules"]
    return mods


def test_entry_point_is_registered():
    eps = [ep for ep in importlib.metadata.entry_points(group="apache_airflow_provider")
           if ep.value.startswith("airflow_provider_dblog")]
    assert len(eps) == 1, eps
    info = eps[0].load()()
    assert info["package-name"] == "airflow-provider-dblog"
    assert info == airflow_provider_dblog.get_provider_info()


@pytest.mark.parametrize("module", _listed_modules(airflow_provider_dblog.get_provider_info()))
def test_every_listed_module_imports(module):
    importlib.import_module(module)


def test_connection_type_hook_class_imports():
    for ct in airflow_provider_dblog.get_provider_info()["connection-types"]:
        mod, _, cls = ct["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(mod), cls)
        assert hook.conn_type == ct["connection-type"]


def test_providers_manager_discovers_provider_and_connection_type():
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    pm = ProvidersManager()
    assert "airflow-provider-dblog" in pm.providers
    assert pm.providers["airflow-provider-dblog"].version == airflow_provider_dblog.__version__
    hook = ProvidersManagerTaskRuntime().hooks.get("dblog")
    assert hook is not None
    assert hook.hook_class_name == "airflow_provider_dblog.hooks.dblog.DBLogHook"
    assert hook.package_name == "airflow-provider-dblog"
    assert hook.connection_id_attribute_name == "dblog_conn_id"


def test_connection_form_is_declared_for_the_ui_without_flask_appbuilder():
    """Airflow 3's UI renders a connection type's fields from the provider info alone:
    the ``dblog`` form shows a config-path field and hides host/login/password/port."""
    import warnings

    from airflow.providers_manager import ProvidersManager

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecated hook-method form would warn here
        pm = ProvidersManager()
        widgets = pm.connection_form_widgets
        behaviours = pm.field_behaviours
    field = widgets["extra__dblog__config_path"]
    assert field.package_name == "airflow-provider-dblog"
    assert field.field["schema"]["title"] == "Config file (YAML)"
    assert not field.is_sensitive
    dblog = behaviours["dblog"]
    assert {"host", "login", "password", "port"} <= set(dblog["hidden_fields"])
    assert dblog["placeholders"]["extra__dblog__config_path"] == "/opt/dblog/dblog.yaml"


def test_hook_reads_the_config_path_the_connection_form_stores(tmp_path, monkeypatch):
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    cfg = tmp_path / "dblog.yaml"
    cfg.write_text("sources: {}\n")
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_UI", '{"conn_type": "dblog", "extra": {"config_path": "%s"}}' % cfg)
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_OLD",
                       '{"conn_type": "dblog", "extra": {"extra__dblog__config_path": "%s"}}' % cfg)
    monkeypatch.delenv("DBLOG_CONFIG", raising=False)
    assert DBLogHook(dblog_conn_id="dblog_ui").resolve_config_path() == str(cfg)
    assert DBLogHook(dblog_conn_id="dblog_old").resolve_config_path() == str(cfg)
