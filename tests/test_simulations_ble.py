"""The BLE simulation (`python -m simulations ble --quick`) reports latencies under the timing model
(`transports.ble.timing`), one row per preset, consistent with the model; and its plot has a title, units and
whole-number counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes

from simulations.report import Report
from tests.test_simulations import run_quick
from transports.ble.timing import PRESETS, offer_timing

pytestmark = pytest.mark.docker


def test_the_ble_simulation_reports_the_timing_model_s_latencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: dict[str, Axes] = {}
    figure = Report.figure

    def keep_axes(self: Report, filename: str, caption: str, draw: Any, **kwargs: Any) -> Path:
        def drawing(ax: Axes) -> object:
            drawn[filename] = ax
            return draw(ax)

        return figure(self, filename, caption, drawing, **kwargs)

    monkeypatch.setattr(Report, "figure", keep_axes)
    figures = run_quick("ble", tmp_path)

    paced = {row["preset"]: row for row in figures["paced"]}
    assert list(paced) == list(PRESETS)  # one row per preset: ios, android, linux
    for name, row in paced.items():
        profile = PRESETS[name]
        assert row["offer_bytes"] > 0 and row["result_bytes"] > 0, row
        model = offer_timing(row["offer_bytes"], row["result_bytes"], profile)
        assert row["model_to_offer_s"] == pytest.approx(model.to_offer)
        run_s = row["model_total_s"] - model.total  # the model's total plus the run's own duration
        assert run_s >= 0, row
        # The paced radio waits as the model says, less what it does not play (the advertising wait and the first
        # connection event): a radio that did not pace would answer the Linux preset in a fraction of a second.
        assert row["measured_s"] is not None, f"{name}: no result on the paced radio"
        unpaced = model.discover_and_connect + 2 * profile.interval_s
        assert row["measured_s"] >= row["model_total_s"] - unpaced, row
    # The presets rank as the published figures do: Android fastest, Linux's defaults far slower.
    assert paced["android"]["model_total_s"] < paced["ios"]["model_total_s"] < paced["linux"]["model_total_s"]
    assert paced["linux"]["measured_s"] > 2 * paced["ios"]["measured_s"]

    report = (tmp_path / "ble" / "report.md").read_text()
    for name, row in paced.items():
        assert f"| {name} | {row['offer_bytes']} | {row['result_bytes']} | {row['model_to_offer_s']:.2f} s |" in report

    ax = drawn["ble_result_latency.png"]
    assert ax.get_title() and ax.get_xlabel().endswith(", s") and ax.get_ylabel() == "offers"
    lo, hi = ax.get_ylim()
    assert all(float(t).is_integer() for t in ax.get_yticks() if lo <= t <= hi)
