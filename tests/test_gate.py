"""The sandbox gate against a scripted probe: withdraw on failure, rejoin by itself, `none` is closed for good."""

from __future__ import annotations

import pytest
import trio

from mesh.gate import GateStatus, SandboxGate, sandbox_mode_from_env


class ScriptedProbe:
    """A scripted executor: each tier's daemon health and canary verdict are set by the test."""

    def __init__(self, tiers: tuple[str, ...] = ("runc",)) -> None:
        self.offered_tiers = tiers
        self.healthy = True
        self.canary_ok = dict.fromkeys(tiers, True)
        self.canaries = 0

    async def health(self, tier: str | None = None) -> GateStatus:
        return GateStatus(self.healthy, "ok" if self.healthy else "no_daemon")

    async def canary(self, tier: str | None = None) -> GateStatus:
        self.canaries += 1
        ok = self.canary_ok[tier or self.offered_tiers[0]]
        if ok:
            return GateStatus(True, "ok")
        return GateStatus(False, "limit_not_enforced", f"{tier}: cgroup.pids: saw None, policy 50", ("cgroup.pids",))


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
            probe.canary_ok["runc"] = False
            await gate.wait_changed()
            assert gate.status.reason == "limit_not_enforced" and gate.status.missing == ("cgroup.pids",)
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


def test_a_failing_tier_is_withdrawn_alone_and_comes_back() -> None:
    """Two tiers: a canary failure withdraws that tier only (the node still takes part), the listeners hear of the
    change of tiers, and the tier returns when its canary passes; with both failing the node withdraws."""

    async def main() -> None:
        probe = ScriptedProbe(("runc", "gvisor"))
        gate = SandboxGate("docker", probe, interval=0.01)
        heard: list[tuple[bool, frozenset[str]]] = []

        async def listener(participating: bool) -> None:
            heard.append((participating, gate.tiers))

        gate.on_change(listener)
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.run)
            assert gate.tiers == {"runc", "gvisor"} and gate.participating
            probe.canary_ok["gvisor"] = False
            await gate.wait_changed()
            assert gate.tiers == {"runc"} and gate.participating and gate.status.reason == "ready"
            assert "gvisor withdrawn: limit_not_enforced" in gate.status.detail
            assert gate.tier_status["gvisor"].missing == ("cgroup.pids",)
            probe.canary_ok["runc"] = False
            await gate.wait_changed()
            assert gate.tiers == frozenset() and not gate.participating
            assert gate.status.reason == "limit_not_enforced" and gate.status.detail.startswith("runc:")
            probe.canary_ok = {"runc": True, "gvisor": True}
            await gate.wait_changed()
            assert gate.tiers == {"runc", "gvisor"}
            nursery.cancel_scope.cancel()
        assert heard == [
            (True, frozenset({"runc", "gvisor"})),
            (True, frozenset({"runc"})),
            (False, frozenset()),
            (True, frozenset({"runc", "gvisor"})),
        ]
        assert all(status.checked_at_ms for status in gate.tier_status.values())

    trio.run(main)


def test_a_none_gate_offers_no_tier() -> None:
    assert SandboxGate("none", ScriptedProbe(("runc", "gvisor"))).tiers == frozenset()
