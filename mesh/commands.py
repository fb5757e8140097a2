"""The async bodies of the CLI commands, kept apart from argument parsing so tests can call them directly."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from executor.contract import ExecRequest, ExecResult, Limits
from executor.policy import ExecutorPolicy
from mesh.gate import SandboxMode
from mesh.identity import NodeIdentity
from mesh.node import MeshNode, NodeConfig, OfferOutcome
from transports.addresses import ip_of, local_address_towards
from transports.base import Transport
from transports.p2p import parse_peer_addr

if TYPE_CHECKING:
    from transports.ble.transport import BleRadio

log = structlog.get_logger("edgecoder.cli")


@dataclass
class NodeOptions:
    identity: NodeIdentity
    listen: list[str]
    peers: list[str]
    sandbox_mode: SandboxMode
    metrics_port: int | None = None
    coordinator: str | None = None
    ble: bool = False
    ble_sim: bool = False
    ble_hci: str | None = None
    state_root: Path | None = None
    announce: list[str] = field(default_factory=list)
    mdns: bool | None = None
    relay_service: bool = False


@contextlib.asynccontextmanager
async def open_ble_radio(options: NodeOptions) -> AsyncIterator[BleRadio | None]:
    """The node's BLE radio, opened (and checked) before anything else: one that cannot work is a
    `BleSetupError` (exit 2) before `ready`. None when the node takes no BLE offers."""
    if not (options.ble or options.ble_sim or options.ble_hci):
        yield None
        return
    from transports.ble.hci import HciSpec
    from transports.ble.radios import open_radio

    # --ble-sim: the simulated radio lives in this process (tests, the demo and simulations add offering peers to it).
    choice = HciSpec.parse(options.ble_hci) if options.ble_hci else "sim" if options.ble_sim else "bluez"
    async with open_radio(choice) as radio:
        yield radio


async def run_node(options: NodeOptions) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly: runs are aborted and no container is left behind."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_ble_radio(options) as ble_radio:
            transports: list[Transport] = []
            if options.coordinator:
                from transports.coordinator import CoordinatorPullTransport

                transports.append(CoordinatorPullTransport(options.coordinator, options.identity))
            if ble_radio is not None:
                from transports.ble import BleRadioTransport

                transports.append(BleRadioTransport(ble_radio, options.identity))
            config = NodeConfig(
                identity=options.identity,
                listen=options.listen,
                announce=options.announce,
                peers=options.peers,
                sandbox_mode=options.sandbox_mode,
                state_root=options.state_root,
                transports=transports,
                mdns=options.mdns,
                relay_service=options.relay_service,
            )
            async with MeshNode.open(config) as node, trio.open_nursery() as nursery:
                await _serve_until_signalled(options, node, nursery, signals)
    print(json.dumps({"event": "stopped"}), flush=True)


async def _serve_until_signalled(
    options: NodeOptions, node: MeshNode, nursery: trio.Nursery, signals: AsyncIterator[int]
) -> None:
    if options.metrics_port is not None:
        from mesh.metrics_server import serve_metrics

        await nursery.start(serve_metrics, node.metrics, options.metrics_port)
    node.addresses.on_change(lambda addrs: print(json.dumps({"event": "addrs", "addrs": addrs}), flush=True))
    print(
        json.dumps(
            {
                "event": "ready",
                "peerId": node.peer_id,
                "addrs": node.addrs,
                "sandboxMode": node.gate.reported_mode,
                "reason": node.gate.status.reason,
            }
        ),
        flush=True,
    )
    async for signum in signals:
        log.info("shutting down", signal=signal.Signals(signum).name)
        await node.drain()
        nursery.cancel_scope.cancel()
        break


@dataclass
class OfferOptions:
    identity: NodeIdentity
    to: str | None
    peers: list[str]
    language: str
    code: str
    input: Any
    limits: Limits
    sandbox: str
    wait_s: float
    ble_hci: str | None = None
    ble_link_model: str | None = None  # pace the radio as this preset would (virtual controllers only)


async def run_ble_offer(options: OfferOptions) -> OfferOutcome:
    """Advertise the offer over BLE from an HCI radio, and wait for a nearby node's verified result."""
    from mesh.offers import TaskOffer
    from transports.ble.hci import HciSpec
    from transports.ble.offering import offer_over_ble
    from transports.ble.radios import open_hci_radio
    from transports.ble.timing import PRESETS

    assert options.ble_hci is not None
    spec = HciSpec.parse(options.ble_hci)
    model = PRESETS[options.ble_link_model] if options.ble_link_model else None
    offer = TaskOffer.create(
        options.identity,
        language=options.language,  # type: ignore[arg-type]
        code=options.code,
        input=options.input,
        limits=options.limits,
        sandbox=options.sandbox,  # type: ignore[arg-type]
        ttl_ms=int(max(60.0, options.wait_s * 2) * 1000),
    )
    outcomes = []
    # Ctrl-C (or SIGTERM) stops advertising and drops the links cleanly, then says so as a typed refusal.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_hci_radio(spec, name="edgecoder-offer", link_model=model) as radio, trio.open_nursery() as n:

            async def advertise() -> None:
                raw = offer.sign(options.identity)
                outcomes.append(await offer_over_ble(radio, options.identity, offer, raw, wait_s=options.wait_s))
                n.cancel_scope.cancel()

            n.start_soon(advertise)
            async for signum in signals:
                log.info("interrupted", signal=signal.Signals(signum).name)
                n.cancel_scope.cancel()
                break
    if not outcomes:
        raise Interrupted  # Ctrl-C before a verified result: exit 130, as on the other offer paths
    return OfferOutcome(result=outcomes[0].result, refusal=outcomes[0].refusal)


class Interrupted(Exception):
    """The user pressed Ctrl-C (or the offerer got SIGTERM); the node was told to stop the run."""


class OfferTooLarge(ValueError):
    """The signed offer is larger than a node takes: refused before anything is dialled."""


async def run_offer(options: OfferOptions) -> OfferOutcome:
    """An offering node takes no work itself (`sandboxMode: none`): it only sends and verifies.

    Ctrl-C cancels the wait; the cancellation sends the abort (an abort frame on the offer stream, or an abort to
    each gossip claimant) before this raises `Interrupted`. The offer's size is checked before anything is dialled.
    """
    if options.ble_hci is not None:
        return await run_ble_offer(options)
    from mesh.codec import DEFAULT_MAX_MESSAGE_BYTES
    from mesh.reasons import Reason, Rejection

    # Listen where the peers we talk to can reach us back (claims and results come to us): the interface that
    # routes to them, loopback for a loopback peer. A one-shot offerer is not advertised to the swarm.
    towards = ip_of(parse_peer_addr(options.to or options.peers[0])[0]) if (options.to or options.peers) else None
    here = local_address_towards(towards) if towards else "127.0.0.1"
    config = NodeConfig(
        identity=options.identity,
        listen=[f"/ip6/{here}/tcp/0" if ":" in here else f"/ip4/{here}/tcp/0"],
        peers=options.peers,
        sandbox_mode="none",
        mdns=False,
        advertise=False,
        forward_offers=False,
    )
    outcome: OfferOutcome | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with MeshNode.open(config) as node, trio.open_nursery() as nursery:
            raw = node.make_offer(
                language=options.language,
                code=options.code,
                input=options.input,
                limits=options.limits,
                sandbox=options.sandbox,
                ttl_ms=int(max(60.0, options.wait_s * 2) * 1000),
            )
            if len(raw) > DEFAULT_MAX_MESSAGE_BYTES:
                raise OfferTooLarge(
                    f"the signed offer is {len(raw):,} bytes; a node takes at most {DEFAULT_MAX_MESSAGE_BYTES:,}"
                )

            async def interrupt() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(interrupt)
            if options.to is not None:
                with trio.move_on_after(options.wait_s + 5):
                    outcome = await node.offer_direct(options.to, raw)
                outcome = outcome or OfferOutcome(refusal=Rejection(Reason.TIMEOUT, "no answer from the node"))
            else:
                await node.wait_for_runner(timeout=min(10.0, options.wait_s))
                outcome = await node.offer_gossip(raw, timeout=options.wait_s)
            nursery.cancel_scope.cancel()
    if outcome is None:
        raise Interrupted
    return outcome


async def run_local(
    language: str, code: str, input: Any, limits: Limits, sandbox: str, subset_check: bool
) -> ExecResult:
    """The local user's run (origin local): host execution is allowed here, and only here."""
    from executor.runner import run_code

    policy = ExecutorPolicy.from_env()
    if not subset_check:
        from dataclasses import replace

        policy = replace(policy, subset_check=False)
    request = ExecRequest(language=language, code=code, input=input, limits=limits)  # type: ignore[arg-type]
    return await run_code(request, sandbox=sandbox, origin="local", policy=policy)


async def run_doctor() -> dict[str, Any]:
    """Whether this machine can sandbox, check by check, with the reason when it cannot."""
    from mesh.gate import sandbox_mode_from_env

    checks: list[dict[str, Any]] = []
    try:
        mode = sandbox_mode_from_env()
    except ValueError as exc:
        return {"ok": False, "checks": [{"name": "SANDBOX_MODE", "ok": False, "detail": str(exc)}]}
    checks.append({"name": "SANDBOX_MODE", "ok": mode == "docker", "detail": mode})
    if mode == "docker":
        from executor.runner import Executor

        policy = ExecutorPolicy.from_env()
        async with Executor.open(policy, node_label="doctor", pool_size=0) as executor:
            health = await executor.health()
            checks.append(
                {"name": "docker daemon and image", "ok": health.ok, "detail": health.detail or health.reason}
            )
            if health.ok:
                canary = await executor.canary()
                checks.append(
                    {
                        "name": "canary run (network none, read-only root, a sandbox uid of its own)",
                        "ok": canary.ok,
                        "detail": canary.detail or canary.reason,
                    }
                )
    ok = all(c["ok"] for c in checks)
    return {"ok": ok, "sandboxMode": "docker" if ok else "none", "checks": checks}
