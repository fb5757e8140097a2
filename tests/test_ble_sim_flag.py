"""`edgecoder node --ble-sim` without `--ble` implies it: the node opens the simulated radio and takes BLE offers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mesh.cli import load_identity, node, resolve_settings
from mesh.commands import NodeOptions, open_ble_radio
from mesh.config import node_settings
from tests.test_ble_hci_process import keygen
from transports.ble.sim import SimulatedRadioHandle

CLI = [sys.executable, "-m", "mesh.cli"]


async def test_ble_sim_alone_opens_the_simulated_radio(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k.key")
    ctx = node.make_context("node", ["--key", str(key), "--ble-sim"])
    with ctx:
        settings = node_settings(resolve_settings(ctx, ctx.params))
    assert settings.ble is False and ctx.params["ble_sim"] is True  # no --ble given
    options = NodeOptions(identity=load_identity(key), settings=settings, ble_sim=ctx.params["ble_sim"])
    async with open_ble_radio(options) as radio:
        assert isinstance(radio, SimulatedRadioHandle)
    async with open_ble_radio(NodeOptions(identity=options.identity, settings=settings)) as none:
        assert none is None  # and without --ble-sim, no radio at all


def test_a_ble_sim_node_process_starts_and_stops_cleanly(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k.key")
    env = {**os.environ, "EDGECODER_SANDBOX_MODE": "none"}
    process = subprocess.Popen(
        [*CLI, "node", "--key", str(key), "--ble-sim"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        assert ready.get("event") == "ready", process.stderr.read() if process.stderr else ""
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err
