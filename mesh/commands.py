"""The async bodies of the CLI commands, kept apart from argument parsing so tests can call them directly."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from executor import lazylog
from executor.contract import ExecRequest, ExecResult, Limits
from executor.policy import ExecutorPolicy

if TYPE_CHECKING:
    # mesh.node brings libp2p (half a second): imported by the commands that run a node, never by `exec`.
    from mesh.config import NodeSettings
    from mesh.node import MeshNode, NodeConfig
    from mesh.offerer import OfferOutcome
    from transports.base import Transport
    from transports.ble.transport import BleRadio
    from transports.wire.identity import NodeIdentity
    from transports.wire.jobs import OutputChunk

log = lazylog.get_logger("edgecoder.cli")


@dataclass
class NodeOptions:
    identity: NodeIdentity
    settings: NodeSettings
    ble_sim: bool = False
    state_root: Path | None = None

    @property
    def ble(self) -> bool:
        return self.settings.ble

    @property
    def ble_hci(self) -> str | None:
        return self.settings.ble_hci


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


def node_config(options: NodeOptions, transports: Sequence[Transport] = ()) -> NodeConfig:
    from mesh.node import NodeConfig

    s = options.settings
    return NodeConfig(
        identity=options.identity,
        listen=s.listen,
        peers=s.bootstrap,
        sandbox_mode=s.sandbox_mode,  # type: ignore[arg-type]
        executor_policy=s.executor_policy,
        intake_policy=s.intake_policy,
        heartbeat_interval=s.heartbeat_interval_s,
        state_root=options.state_root,
        announce=s.announce,
        mdns=s.mdns,
        relay_service=s.relay_service,
        isolation=s.isolation,
        transports=transports,
    )


async def run_node(options: NodeOptions) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly: runs are aborted and no container is left behind."""
    from mesh.node import MeshNode

    settings = options.settings
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_ble_radio(options) as ble_radio:
            transports: list[Transport] = []
            if settings.coordinator_url:
                from transports.coordinator import CoordinatorPullTransport

                transports.append(
                    CoordinatorPullTransport(
                        settings.coordinator_url, options.identity, coordinator_key=settings.coordinator_key
                    )
                )
            if ble_radio is not None:
                from transports.ble import BleRadioTransport

                transports.append(BleRadioTransport(ble_radio, options.identity))
            config = node_config(options, transports)
            async with MeshNode.open(config) as node, trio.open_nursery() as nursery:
                await _serve_until_signalled(options, node, nursery, signals)
    print(json.dumps({"event": "stopped"}), flush=True)


async def _serve_until_signalled(
    options: NodeOptions, node: MeshNode, nursery: trio.Nursery, signals: AsyncIterator[int]
) -> None:
    settings = options.settings
    ready: dict[str, Any] = {
        "event": "ready",
        "peerId": node.peer_id,
        "addrs": node.addrs,
        "sandboxMode": node.gate.reported_mode,
        "reason": node.gate.status.reason,
    }
    if settings.metrics_bind is not None:
        from mesh.metrics_server import serve_metrics
        from mesh.status import health, node_status

        host, port = settings.metrics_bind
        urls = await nursery.start(
            partial(
                serve_metrics,
                node.metrics,
                port,
                host,
                status=lambda: node_status(node),
                health=lambda: health(node),
            )
        )
        ready["metrics"] = urls[0]
        ready["metricsPort"] = int(urls[0].rsplit(":", 1)[1])
    if settings.coordinator_url:
        ready["coordinator"] = settings.coordinator_url
    node.addresses.on_change(lambda addrs: print(json.dumps({"event": "addrs", "addrs": addrs}), flush=True))
    log.info(
        "node started",
        peer=node.peer_id,
        config=None if settings.resolved.file is None else str(settings.resolved.file),
        concurrency=settings.executor_policy.max_concurrent,
        queue_size=settings.intake_policy.queue_size,
    )
    print(json.dumps(ready), flush=True)
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
    min_isolation: str | None = None  # the weakest sandbox tier the offer accepts (runc, gvisor)
    needs: Any = None  # transports.wire.needs.Needs: the runtime (and its digest) the offer needs; None: python
    replicas: int = 1  # gossip: distinct runners that must each run it and agree
    follow: bool = False  # direct: print the program's output as it comes (after a line naming the offer)


async def run_ble_offer(options: OfferOptions) -> OfferOutcome:
    """Advertise the offer over BLE from an HCI radio, and wait for a nearby node's verified result."""
    from mesh.offerer import OfferOutcome
    from transports.ble.hci import HciSpec
    from transports.ble.offering import offer_over_ble
    from transports.ble.radios import open_hci_radio
    from transports.ble.timing import PRESETS
    from transports.wire.offers import TaskOffer

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
        min_isolation=options.min_isolation,
        needs=options.needs,
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


def show_chunk(chunk: OutputChunk) -> None:
    """A followed program's output, as it comes: its stdout on ours, its stderr on ours."""
    out = sys.stdout if chunk.stream == "stdout" else sys.stderr
    out.buffer.write(chunk.data)
    out.flush()


class Interrupted(Exception):
    """The user pressed Ctrl-C (or the offerer got SIGTERM); the node was told to stop the run."""


class OfferTooLarge(ValueError):
    """The signed offer is larger than a node takes: refused before anything is dialled."""


async def run_offer(options: OfferOptions) -> OfferOutcome:
    """An offering node takes no work itself (`sandboxMode: none`): it only sends and verifies.

    Ctrl-C cancels the wait; the cancellation sends the offer's signed cancel on a direct offer's stream (or an abort
    to each gossip claimant) before this raises `Interrupted`. The offer's size is checked before anything is dialled.
    """
    if options.ble_hci is not None:
        return await run_ble_offer(options)
    from mesh.node import MeshNode, NodeConfig
    from mesh.offerer import OfferOutcome
    from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES
    from transports.wire.offers import Audience, TaskOffer, parse_offer
    from transports.wire.reasons import Reason, Rejection

    def too_large(raw: bytes) -> OfferTooLarge | None:
        if len(raw) <= DEFAULT_MAX_MESSAGE_BYTES:
            return None
        return OfferTooLarge(
            f"the signed offer is {len(raw):,} bytes; a node takes at most {DEFAULT_MAX_MESSAGE_BYTES:,}: "
            "send less code or --input"
        )

    fields: dict[str, Any] = {
        "language": options.language,
        "code": options.code,
        "input": options.input,
        "limits": options.limits,
        "sandbox": options.sandbox,
        "ttl_ms": int(max(60.0, options.wait_s * 2) * 1000),
        "min_isolation": options.min_isolation,
        "needs": options.needs,
        "follow": options.follow,
    }
    # Sized before anything is dialled (bootstrap peers included): the node's own addresses, which it learns only
    # once it listens, add a few hundred bytes at most, and are checked again below.
    audience = Audience.direct(options.to.rsplit("/p2p/", 1)[-1]) if options.to else None
    provisional = TaskOffer.create(options.identity, reply_to=(), audience=audience, **fields).sign(options.identity)
    if (error := too_large(provisional)) is not None:
        raise error
    from transports.addresses import ip_of, local_address_towards
    from transports.operator_addrs import parse_peer_addr

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
            raw = node.make_offer(to=options.to, **fields)
            if (error := too_large(raw)) is not None:
                raise error

            async def interrupt() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(interrupt)
            if options.to is not None:
                on_output = None
                if options.follow:
                    # The offer's id first (what `edgecoder cancel` takes), then the program's output as it comes.
                    print(
                        json.dumps({"event": "offered", "offerId": parse_offer(raw).offer.offer_id.hex()}), flush=True
                    )
                    on_output = show_chunk
                with trio.move_on_after(options.wait_s + 5):
                    # Ctrl-C sends the offer's signed cancel on the stream: the runner stops the run at once.
                    outcome = await node.offer_direct(options.to, raw, cancel_on_stop=True, on_output=on_output)
                outcome = outcome or OfferOutcome(refusal=Rejection(Reason.TIMEOUT, "no answer from the node"))
            else:
                await node.wait_for_runner(timeout=min(10.0, options.wait_s))
                outcome = await node.offer_gossip(raw, timeout=options.wait_s, replicas=options.replicas)
            nursery.cancel_scope.cancel()
    if outcome is None:
        raise Interrupted
    return outcome


async def run_local(
    language: str,
    code: str,
    input: Any,
    limits: Limits,
    sandbox: str,
    subset_check: bool,
    isolation: str | None = None,
    runtime: str = "python",
    runtimes: tuple[Any, ...] = (),
) -> ExecResult:
    """The local user's run (origin local): host execution is allowed here, and only here. `isolation` (runc or
    gvisor) is the run's container runtime; None: EDGECODER_ISOLATION's weakest tier, else runc. `runtime` is one of
    the declared `runtimes` (executor.runtimes.Runtime, beyond python: the settings' `executor.runtimes`)."""
    from dataclasses import replace

    from executor.runner import run_code

    policy = ExecutorPolicy.from_env()
    if not subset_check:
        policy = replace(policy, subset_check=False)
    if isolation is not None:
        policy = replace(policy, isolation=(isolation,))  # type: ignore[arg-type]
    if runtimes:
        policy = replace(policy, runtimes=runtimes)
    request = ExecRequest(language=language, code=code, input=input, limits=limits)  # type: ignore[arg-type]
    return await run_code(
        request, sandbox=sandbox, origin="local", policy=policy, min_isolation=isolation, runtime=runtime
    )


async def run_doctor(settings: NodeSettings | None = None) -> dict[str, Any]:
    """Whether this machine can sandbox, check by check, with the fix when it cannot (mesh/doctor.py).

    With `settings` (`doctor --config`), the node's own sandbox mode and executor policy (its image, its seccomp
    profile, its isolation tiers) are the ones checked; without, the environment's."""
    from mesh.doctor import check
    from mesh.doctor import run_doctor as doctor
    from mesh.gate import sandbox_mode_from_env

    try:
        mode = settings.sandbox_mode if settings is not None else sandbox_mode_from_env()
        policy = settings.executor_policy if settings is not None else ExecutorPolicy.from_env()
    except ValueError as exc:
        return {"ok": False, "checks": [check("settings", "fail", str(exc), "see docs/reference/config.md")]}
    return await doctor(policy, mode)
