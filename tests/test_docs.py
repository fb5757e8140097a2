"""The user docs build strictly with the material theme, load nothing from outside, and are grouped as planned."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent
NAV = [
    "Getting started",
    "Join a swarm",
    "Run a node as a service",
    "Offer work",
    "Runtimes",
    "BLE",
    "Coordinator",
    "Simulations",
    "Reference",
    "Troubleshooting",
    "Design",
    "Development",
]


class Loads(HTMLParser):
    """Every address a page makes the browser fetch: scripts, style sheets, icons, images, frames."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video") and values.get("src"):
            self.fetched.append(str(values["src"]))
        if tag == "link" and values.get("rel") != "canonical" and values.get("href"):
            self.fetched.append(str(values["href"]))


def test_the_site_builds_strictly_and_fetches_nothing_from_outside(tmp_path: Path) -> None:
    site = tmp_path / "site"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    build = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr
    pages = list(site.rglob("*.html"))
    assert len(pages) > 15
    outside = []
    for page in pages:
        parser = Loads()
        parser.feed(page.read_text())
        outside += [f"{page.name}: {url}" for url in parser.fetched if re.match(r"(https?:)?//", url)]
    for sheet in site.rglob("*.css"):
        outside += [
            f"{sheet.name}: {m}" for m in re.findall(r"url\((?:['\"])?((?:https?:)?//[^)'\"]+)", sheet.read_text())
        ]
        outside += [f"{sheet.name}: {m}" for m in re.findall(r"@import\s+[^;]*https?://[^;]+", sheet.read_text())]
    assert not outside, outside
    assert (site / "assets" / "javascripts").is_dir()  # the material theme, served from the site itself
    cli = (site / "reference" / "cli.html").read_text()
    for command in ("edgecoder node", "edgecoder offer", "edgecoder config show", "edgecoder coordinator submit"):
        assert command in cli, command  # generated from click at build time


def test_the_navigation_is_grouped_for_users() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material" and config["theme"]["font"] is False
    assert [next(iter(entry)) for entry in config["nav"]] == NAV
    reference = next(entry["Reference"] for entry in config["nav"] if "Reference" in entry)
    assert [next(iter(e)) for e in reference] == [
        "Command line",
        "Wire protocol",
        "Metrics and status",
        "Configuration keys",
        "Reason codes",
    ]
