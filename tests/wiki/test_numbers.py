"""Numbers as the journal shows them (wiki/numbers.py): by magnitude and unit, never in
e-notation; counted nouns agree."""

from __future__ import annotations

import pytest
from infer_forge.wiki.numbers import count, exact, metric_value, number, unit


@pytest.mark.parametrize(("v", "shown"), [
    (11734.2, "11,734"), (1.17e4, "11,700"), (88.44, "88.4"), (88.0, "88"), (3.14159, "3.14"),
    (0.93412, "0.934"), (0.61, "0.61"), (1.2e-5, "0.000012"), (1e-12, "0"), (0.0, "0"),
    (-2.5e6, "-2,500,000"), (12, "12"), (2000, "2,000"), (123456, "123,456"), (float("nan"), "nan"),
    (float("inf"), "inf"), (True, "True"), ("x", "x"),
])
def test_number_by_magnitude(v, shown):
    assert number(v) == shown
    assert "e+" not in number(v) and "e-" not in number(v)


def test_units_from_metric_names():
    assert unit("output_throughput") == "tok/s" and unit("request_throughput") == "req/s"
    assert unit("median_ttft_ms") == "ms" and unit("duration_s") == "s"
    assert unit("max_output_tokens_per_s") == "tok/s" and unit("requests_per_s") == "req/s"
    assert unit("token_match") == "" and unit("completed") == ""
    assert metric_value("output_throughput", 11734.2) == "11,734 tok/s"
    assert metric_value("p99_ttft_ms", 88.44) == "88.4 ms"
    assert metric_value("token_match", 0.934) == "0.934"
    assert metric_value("median_ttft_ms", None) == "—"


def test_thresholds_as_written():
    assert exact(2000.5) == "2,000.5" and exact(500) == exact(500.0) == "500"
    assert exact(-0.25) == "-0.25" and exact(0.99) == "0.99" and exact(1e-7) == "0.0000001"
    assert exact(2.5e20) == number(2.5e20) and "e" not in exact(2.5e20)


def test_counts_agree():
    assert count(1, "task") == "1 task" and count(2, "task") == "2 tasks"
    assert count(0, "value") == "0 values" and count(3, "entry") == "3 entries"
    assert count(2, "stretch") == "2 stretches" and count(2, "day") == "2 days"
    assert count(12000, "event") == "12,000 events"
