"""Figures a scenario measured (time to connect, time to answer each offer), printed and written as JSON.

They are reported, never asserted: speed is the benchmarks' business. `pytest -s` shows the printed table; the JSON
file lands in `TIMINGS_DIR` (one file per test run), for the lead to quote.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMINGS_DIR = Path(os.environ.get("EDGECODER_NETNS_TIMINGS", "/tmp/edgecoder-netns-timings"))


@dataclass
class Timings:
    scenario: str
    figures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """An observation beside the figures (which node ran what, claim counts)."""
        self.notes.append(text)

    def record(self, what: str, seconds: float, **details: Any) -> None:
        self.figures.append({"what": what, "seconds": round(seconds, 4), **details})

    def write(self) -> Path:
        TIMINGS_DIR.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.scenario)
        path = TIMINGS_DIR / f"{safe}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
        path.write_text(
            json.dumps({"scenario": self.scenario, "figures": self.figures, "notes": self.notes}, indent=2) + "\n"
        )
        return path

    def report(self) -> str:
        lines = [f"timings of {self.scenario}:"]
        for figure in self.figures:
            details = {k: v for k, v in figure.items() if k not in ("what", "seconds")}
            extra = "  " + " ".join(f"{k}={v}" for k, v in details.items()) if details else ""
            lines.append(f"  {figure['what']:<56} {figure['seconds'] * 1000:9.1f} ms{extra}")
        lines += [f"  note: {text}" for text in self.notes]
        return "\n".join(lines)

    def flush(self) -> Path | None:
        if not self.figures and not self.notes:
            return None
        path = self.write()
        print(f"\n{self.report()}\n  (written to {path})")
        return path
