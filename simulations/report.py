"""A scenario's report: Markdown text with tables and PNG plots (matplotlib, Agg backend) in one directory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here, and none in CI
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator


class Report:
    def __init__(self, name: str, out_dir: Path, title: str) -> None:
        self.name = name
        self.out_dir = out_dir
        self.lines: list[str] = [f"# {title}", ""]
        self.figures: list[Path] = []
        # The figures a test or the docs read back; kept beside the prose so both say the same thing.
        self.figures_by_name: dict[str, Any] = {}
        out_dir.mkdir(parents=True, exist_ok=True)

    def text(self, paragraph: str) -> None:
        self.lines += [paragraph.strip(), ""]

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.lines.append("| " + " | ".join(headers) + " |")
        self.lines.append("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            self.lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
        self.lines.append("")

    def figure(
        self,
        filename: str,
        caption: str,
        draw: Callable[[Axes], object],
        *,
        counted_x: bool = False,
        counted_y: bool = False,
    ) -> Path:
        """A plot with the caption as its title. `counted_x`/`counted_y`: that axis counts things (nodes, offers,
        hops), so its ticks are whole numbers. Every axis should say what it measures and in which unit."""
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
        try:
            draw(ax)
            if not ax.get_title():
                ax.set_title(caption, fontsize=9)
            if counted_x:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if counted_y:
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            fig.tight_layout()
            path = self.out_dir / filename
            fig.savefig(path)
        finally:
            plt.close(fig)
        self.figures.append(path)
        self.lines += [f"![{caption}]({filename})", "", f"*{caption}*", ""]
        return path

    def write(self) -> Path:
        path = self.out_dir / "report.md"
        path.write_text("\n".join(self.lines))
        return path


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
