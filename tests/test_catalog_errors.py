"""A catalog that cannot be loaded, in one line: a scheme typo, a catalog named but defined nowhere
(and where PyIceberg looked), a REST server that refuses the connection, a Hive metastore that is
down (said once, not also by thrift's own logger)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fanout_sink import preflight
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.catalog_errors import check_settings, unreachable
from fanout_sink.config.loading import parse_config
from fanout_sink.errors import CatalogSettingsError


def _problem(catalog: dict[str, str]) -> str:
    tables = {"a.b": {"when": "true"}}
    config = parse_config({"name": "s", "source": {"topics": ["t"]}, "catalog": catalog, "tables": tables})
    findings = list(preflight.check_catalog(preflight.Preflight(config, 1, dry_run=True)))
    assert [f.level for f in findings] == ["problem"], findings
    assert "\n" not in findings[0].text
    return findings[0].text


def test_a_scheme_typo_is_named_with_the_schemes_there_are(tmp_path: Path) -> None:
    uri = f"sqllite:///{tmp_path}/catalog.db"
    text = _problem({"uri": uri})
    assert text == (
        f"catalog.uri {uri}: scheme 'sqllite' is no SQL database SQLAlchemy knows "
        "(known: mssql, mysql, oracle, postgresql, sqlite, each with an optional +driver)"
    )
    assert "NoSuchModuleError" not in text and "reachable" not in text
    with pytest.raises(CatalogSettingsError, match="scheme 'sqllite'"):  # every command, not only run
        load_catalog(CatalogSettings(uri=uri), create=False)
    assert _problem({"type": "rest", "uri": "htp://catalog:8181"}) == (
        "catalog.uri htp://catalog:8181: a rest catalog's URI starts with http:// or https://, not htp"
    )
    check_settings("lake", "hive", "thrift://a:9083,thrift://b:9083")


def test_a_catalog_defined_nowhere_says_where_pyiceberg_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYICEBERG_HOME", raising=False)
    monkeypatch.chdir(work)
    assert _problem({"name": "prod"}) == (
        "catalog.uri is not set: the sql catalog 'prod' needs one; no .pyiceberg.yaml found (looked for "
        f"{home}/.pyiceberg.yaml, {work}/.pyiceberg.yaml ($PYICEBERG_HOME is not set)), "
        "nor PYICEBERG_CATALOG__PROD__* variables"
    )
    (home / ".pyiceberg.yaml").write_text("catalog:\n  staging:\n    uri: sqlite:///s.db\n")
    assert _problem({"name": "prod"}).endswith(
        f"needs one; {home}/.pyiceberg.yaml defines no catalog 'prod' (it has: staging), "
        "nor PYICEBERG_CATALOG__PROD__* variables"
    )


def test_a_rest_catalog_that_refuses_the_connection_is_one_short_line() -> None:
    text = _problem({"type": "rest", "uri": "http://127.0.0.1:1"})
    assert text == (
        "catalog 'lake' (catalog.type=rest, catalog.uri) is not reachable: "
        "cannot connect to http://127.0.0.1:1/v1/config: Connection refused"
    )
    assert (
        unreachable(RuntimeError("x" * 1000)).endswith("...")
        and len(unreachable(RuntimeError("x" * 1000))) == 300
    )


def test_a_hive_metastore_that_is_down_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        text = _problem({"type": "hive", "uri": "thrift://127.0.0.1:1"})
    assert text.endswith(
        "is not reachable: TTransportException: Could not connect to any of [('127.0.0.1', 1)]"
    )
    assert not [r for r in caplog.records if r.name.startswith("thrift")], "thrift's own ERROR line"
