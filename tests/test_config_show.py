"""`edgecoder config show`, as a user runs it: the effective settings, and for each where it came from (a flag, an
EDGECODER_* variable, the config file or the default), as a table a person reads and as JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mesh.config import SETTINGS

CLI = [sys.executable, "-m", "mesh.cli"]
# A table row: the key, its value, at least two spaces, then where the value came from.
ROW = re.compile(
    r"^(?P<key>[a-z_]+\.[a-z_]+) +(?P<value>.+?) {2,}(?P<source>default|flag --\S+|env EDGECODER_\w+|file \S+)$"
)


def config_show(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "edgecoder.toml"
    config.write_text('[executor]\nconcurrency = 3\npool_size = 1\n[log]\nlevel = "warning"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGECODER_")}
    env |= {"EDGECODER_CONFIG": str(config), "EDGECODER_POOL_SIZE": "0"}
    return subprocess.run(
        [*CLI, "config", "show", "--queue-size", "10", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_config_show_prints_every_setting_with_its_source(tmp_path: Path) -> None:
    shown = config_show(tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    header, *lines = shown.stdout.splitlines()
    assert header == f"config file: {tmp_path / 'edgecoder.toml'}"
    rows = {}
    for line in lines:
        match = ROW.match(line)
        assert match is not None, f"not a key, a value and a source: {line!r}"
        rows[match["key"]] = (match["value"].strip(), match["source"])
    assert list(rows) == [s.key for s in SETTINGS]  # every setting, in the table's order
    file = f"file {tmp_path / 'edgecoder.toml'}"
    assert rows["intake.queue_size"] == ("10", "flag --queue-size")  # a flag beats the rest
    assert rows["executor.pool_size"] == ("0", "env EDGECODER_POOL_SIZE")  # the environment beats the file
    assert rows["executor.concurrency"] == ("3", file)
    assert rows["log.level"] == ('"warning"', file)
    assert rows["limits.max_memory_mb"] == ("512", "default")
    assert rows["node.mdns"] == ("(auto)", "default")  # an unset value says what unset means


def test_config_show_json_gives_each_value_and_its_source(tmp_path: Path) -> None:
    shown = config_show(tmp_path, "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["file"] == str(tmp_path / "edgecoder.toml")
    rows = {r["key"]: (r["value"], r["source"], r["from"]) for r in document["settings"]}
    assert list(rows) == [s.key for s in SETTINGS]
    assert rows["intake.queue_size"] == (10, "flag", "--queue-size")
    assert rows["executor.pool_size"] == (0, "env", "EDGECODER_POOL_SIZE")
    assert rows["executor.concurrency"] == (3, "file", str(tmp_path / "edgecoder.toml"))
    assert rows["limits.max_memory_mb"] == (512, "default", "")
