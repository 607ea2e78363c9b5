"""The Grafana dashboard and the Prometheus alert rules in docs/monitoring/ query only series the sink
serves, as its metrics registry names them (a renamed metric breaks this test, not an operator's
dashboard), show what an operator asks of a sink, and docs/monitoring.md says what each panel answers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric

from fanout_sink.metrics import SinkMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "monitoring" / "fanout-sink-dashboard.json"
RULES = ROOT / "docs" / "monitoring" / "fanout-sink-alerts.yaml"
GUIDE = ROOT / "docs" / "monitoring.md"
NAME = re.compile(r"\bfanout_sink_[a-z0-9_]*[a-z0-9]")
"""A sink series' name in PromQL or prose (``fanout_sink_`` alone, the prefix, is no series)."""

_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "info": ("_info",),
}
"""The series each family type exposes, as ``prometheus_client`` writes them."""


def _families() -> list[Metric]:
    return list(SinkMetrics("s", 30.0).registry.collect())


def served() -> dict[str, str]:
    """Every series name the sink's registry serves -> its family's name."""
    return {
        family.name + suffix: family.name
        for family in _families()
        for suffix in _SAMPLE_SUFFIXES[family.type]
    }


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [var["definition"] for var in dashboard["templating"]["list"] if var["type"] == "query"]
    return queries


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_series_the_dashboard_and_the_rules_query_is_served() -> None:
    series = served()
    names = set(series)
    assert "fanout_sink_rows_committed_total" in names and "fanout_sink_info" in names  # the derivation
    prose = names | set(series.values())  # the guide may name a histogram by its family
    for source, queries, known in (
        (DASHBOARD.name, _dashboard_queries(), names),
        (RULES.name, [rule["expr"] for rule in _rules()], names),
        (GUIDE.name, [GUIDE.read_text()], prose),
    ):
        unknown = sorted({n for query in queries for n in NAME.findall(query)} - known)
        assert not unknown, f"{source} names series the sink does not serve: {unknown}"


def test_the_dashboard_shows_every_family_the_sink_serves() -> None:
    """A new metric gets a panel (or a rule): the dashboard is the operator's view of all of them."""
    queried = {
        n for query in _dashboard_queries() + [r["expr"] for r in _rules()] for n in NAME.findall(query)
    }
    shown = {served()[n] for n in queried}
    # The sink's VTTS as a timestamp: its age, at scrape time, is what the panels and rules use.
    missing = sorted({f.name for f in _families()} - shown - {"fanout_sink_vtts_timestamp_seconds"})
    assert not missing, f"no panel or rule shows {missing}"
    asked = {  # issue 49: per-table VTTS age and rows, lag, batch and round times
        "fanout_sink_table_vtts_age_seconds",
        "fanout_sink_rows_committed",
        "fanout_sink_partition_lag",
        "fanout_sink_batch_duration_seconds",
        "fanout_sink_commit_round_duration_seconds",
    }
    panels_only = {served()[n] for query in _dashboard_queries() for n in NAME.findall(query)}
    assert asked <= panels_only, asked - panels_only


def test_each_panel_says_what_it_answers_and_the_guide_names_it() -> None:
    guide = GUIDE.read_text()
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["description"].strip(), f"panel {panel['title']!r} has no description"
        assert panel["targets"], f"panel {panel['title']!r} queries nothing"
        assert f"| {panel['title']} |" in guide, f"docs/monitoring.md has no row for panel {panel['title']!r}"
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_each_alert_rule_is_complete_and_described_in_the_guide() -> None:
    guide = GUIDE.read_text()
    rules = _rules()
    assert rules
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= rule.keys(), rule
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}, rule
        assert f"`{rule['alert']}`" in guide, f"docs/monitoring.md does not describe {rule['alert']}"
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))


LABEL_LIST = re.compile(r"\b(?:group_left|group_right|on|ignoring|by|without)\s*\(([^()]*)\)?")
LABELS = re.compile(r"\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*(?:,\s*[A-Za-z_][A-Za-z0-9_]*\s*)*,?\s*)?")


def test_a_parenthesis_after_a_grouping_keyword_holds_label_names_only() -> None:
    """PromQL reads ``group_left (a + b)`` as a label list: such a rule never loads (Prometheus' parser:
    "unexpected <op:+> in grouping opts"); write ``group_left () (a + b)``. A PromQL mistake the names
    above cannot catch, checked without a PromQL parser (Prometheus v0.316.0's Go parser read every
    query of both files by hand)."""
    for query in _dashboard_queries() + [rule["expr"] for rule in _rules()]:
        for labels in LABEL_LIST.findall(query):
            assert LABELS.fullmatch(labels), f"not a label list in {query!r}: ({labels})"
