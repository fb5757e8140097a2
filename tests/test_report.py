"""Plots drawn through `simulations.report.Report`: a title, labels kept, whole-number ticks on counted axes."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes

from simulations.report import Report

# Three latencies in ten bins: each bin counts 0 or 1, so matplotlib's own ticks would be 0, 0.2, ... 1.0.
LATENCIES_S = [0.11, 0.52, 0.93]


def draw_histogram(tmp_path: Path, *, counted_y: bool, title: str | None = None) -> tuple[Report, Axes, Path]:
    report = Report("t", tmp_path, "A report")
    drawn: list[Axes] = []

    def draw(ax: Axes) -> None:
        drawn.append(ax)
        ax.hist(LATENCIES_S, bins=10)
        ax.set_xlabel("advertising to verified result, s")
        ax.set_ylabel("offers")
        if title is not None:
            ax.set_title(title)

    path = report.figure("latency.png", "Result latency, s", draw, counted_y=counted_y)
    return report, drawn[0], path


def whole(ticks: object) -> bool:
    return all(float(t).is_integer() for t in ticks)  # type: ignore[attr-defined]


def test_a_figure_has_its_caption_as_title_its_labels_and_whole_ticks_where_counted(tmp_path: Path) -> None:
    report, ax, path = draw_histogram(tmp_path, counted_y=True)
    assert ax.get_title() == "Result latency, s"
    assert ax.get_xlabel() == "advertising to verified result, s" and ax.get_ylabel() == "offers"
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert len(ticks) >= 2 and whole(ticks), ticks
    assert path.exists() and path.stat().st_size > 1000 and report.figures == [path]
    assert "![Result latency, s](latency.png)" in "\n".join(report.lines)


def test_an_axis_not_counted_keeps_matplotlib_s_ticks(tmp_path: Path) -> None:
    """The control for the test above: the same data, not marked counted, gets fractional ticks."""
    _, ax, _ = draw_histogram(tmp_path, counted_y=False)
    assert not whole(ax.get_yticks())


def test_a_title_the_drawing_sets_is_kept(tmp_path: Path) -> None:
    _, ax, _ = draw_histogram(tmp_path, counted_y=True, title="Own title")
    assert ax.get_title() == "Own title"
