"""The sandbox gate against a scripted probe: withdraw on failure, rejoin by itself, `none` is closed for good."""

from __future__ import annotations

import pytest
import trio

from mesh.gate import GateStatus, SandboxGate, sandbox_mode_from_env


class ScriptedProbe:
    def __init__(self) -> None:
        self.healthy = True
        self.canary_ok = True
        self.canaries = 0

    async def health(self) -> GateStatus:
        return GateStatus(self.healthy, "ok" if self.healthy else "no_daemon")

    async def canary(self) -> GateStatus:
        self.canaries += 1
        return GateStatus(self.canary_ok, "ok" if self.canary_ok else "canary_failed")


def test_gate_withdraws_and_rejoins() -> None:
    async def main() -> None:
        probe = ScriptedProbe()
        gate = SandboxGate("docker", probe, interval=0.01)
        changes: list[bool] = []

        async def listener(participating: bool) -> None:
            changes.append(participating)

        gate.on_change(listener)
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.run)
            assert gate.participating and gate.reported_mode == "docker" and probe.canaries == 1
            probe.healthy = False
            await gate.wait_changed()
            assert not gate.participating and gate.status.reason == "no_daemon"
            assert gate.reported_mode == "none"
            probe.healthy = True
            await gate.wait_changed()
            assert gate.participating
            probe.canary_ok = False
            await gate.wait_changed()
            assert gate.status.reason == "canary_failed"
            nursery.cancel_scope.cancel()
        assert changes == [True, False, True, False]

    trio.run(main)


def test_sandbox_mode_none_never_participates() -> None:
    async def main() -> None:
        gate = SandboxGate("none", None)
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.run)
        assert not gate.participating and gate.status.reason == "sandbox_mode_none"
        assert gate.reported_mode == "none"

    trio.run(main)


def test_sandbox_mode_from_env() -> None:
    assert sandbox_mode_from_env({}) == "docker"
    assert sandbox_mode_from_env({"SANDBOX_MODE": "None"}) == "none"
    with pytest.raises(ValueError, match="SANDBOX_MODE"):
        sandbox_mode_from_env({"SANDBOX_MODE": "host"})
