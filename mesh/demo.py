"""`edgecoder demo`: a small mesh on loopback in one process, running real signed offers in Docker.

It shows the things a user should see: a gossip offer claimed and run exactly once (sealed: what a node that
only listens to the offers topic saw is shown too), a direct offer, a BLE offer from a simulated nearby laptop, a
numpy offer that needs the python-science runtime (invited only where it is built, refused where it is not), and
what the mesh refuses (a node without a sandbox, host execution, a tampered offer), each with its reason code and
timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from executor.contract import Limits
from executor.policy import ExecutorPolicy
from executor.runtimes import science_runtime
from mesh.node import MeshNode, NodeConfig
from mesh.offerer import OfferOutcome
from transports.wire.codec import pack
from transports.wire.identity import NodeIdentity, public_key_of_peer_id
from transports.wire.needs import Needs
from transports.wire.offers import TaskOffer, parse_offer
from transports.wire.peerid import ed25519_peer_id
from transports.wire.results import TaskResult

SUM_PY = "import json, sys\nxs = json.load(sys.stdin)['xs']\nprint(f'sum of {len(xs)} numbers = {sum(xs)}')\n"
FIB_JS = (
    "let text = '';\n"
    "process.stdin.on('data', (chunk) => { text += chunk; });\n"
    "process.stdin.on('end', () => {\n"
    "  const n = JSON.parse(text).n;\n"
    "  let [a, b] = [0n, 1n];\n"
    "  for (let i = 0; i < n; i++) [a, b] = [b, a + b];\n"
    "  console.log(`fib(${n}) = ${a}`);\n"
    "});\n"
)
WHOAMI_PY = "import os\nprint('uid', os.getuid(), 'interfaces', sorted(os.listdir('/sys/class/net')))\n"
BLE_PY = "print('hello over BLE from', 'a neighbour')"
NUMPY_PY = (
    "import json, sys\nimport numpy as np\na = np.array(json.load(sys.stdin)['a'])\n"
    "print('numpy', np.__version__, 'a @ a.T =', (a @ a.T).tolist())\n"
)
NUMPY_OUT = re.compile(r"numpy [0-9.]+ a @ a\.T = \[\[5, 11\], \[11, 25\]\]")
# What each program that runs must print: the demo checks every output it shows, not only that a run said ok.
SUM_OF_1_TO_100 = "sum of 100 numbers = 5050"
FIB_90 = "fib(90) = 2880067194370816120"
BLE_HELLO = "hello over BLE from a neighbour"
WHOAMI = re.compile(r"uid (\d+) interfaces \['lo'\]")  # only loopback, and not root


def wrong_output(outcome: OfferOutcome, expected: str | re.Pattern[str]) -> str | None:
    """Why a run's output is not what its program prints (None when it is): no result, a failed run, other text."""
    if outcome.result is None:
        return f"no result ({outcome.refusal.reason if outcome.refusal else 'no answer'})"
    result = outcome.result.result
    if not result.ok:
        return f"the run failed ({result.error_kind}): {result.stderr.strip()[:200]!r}"
    printed = result.stdout.strip()
    if isinstance(expected, str):
        return None if printed == expected else f"it printed {printed[:200]!r}, not {expected!r}"
    found = expected.fullmatch(printed)
    if found is None or (found.groups() and found.group(1) == "0"):
        return f"it printed {printed[:200]!r}, which does not match {expected.pattern!r} with a uid other than 0"
    return None


def _short(peer_id: str) -> str:
    return f"{peer_id[:8]}…{peer_id[-4:]}"


def _line(
    title: str, outcome: OfferOutcome, elapsed_ms: float, names: dict[bytes, str], *, expected_refusal: bool = False
) -> None:
    if outcome.result is not None:
        r = outcome.result.result
        who = names.get(outcome.result.executor, _short(ed25519_peer_id(outcome.result.executor)))
        status = "ok" if r.ok else f"FAILED ({r.error_kind})"
        text = (r.stdout or r.stderr).strip().replace("\n", " | ")
        print(f"  {title:<36} {status:<8} by {who:<9} run {r.duration_ms:>4} ms, end to end {elapsed_ms:>5.0f} ms")
        print(f"  {'':<36} └ {text[:100]}")
    else:
        assert outcome.refusal is not None
        status = "refused, as expected:" if expected_refusal else "REFUSED:"
        print(f"  {title:<36} {status} {outcome.refusal.reason}")
        print(f"  {'':<36} └ {outcome.refusal.detail[:100]}")


async def _timed(fn: Callable[[], Awaitable[OfferOutcome]]) -> tuple[OfferOutcome, float]:
    start = time.perf_counter()
    outcome = await fn()
    return outcome, (time.perf_counter() - start) * 1000


async def run_demo(runners: int = 3, ble: bool = True) -> int:
    """Returns the process exit code: 0 when every expectation of the demo held."""
    from mesh.commands import run_doctor

    report = await run_doctor()
    if not report["ok"]:
        print("This machine cannot sandbox, so the demo cannot run real offers:")
        for check in report["checks"]:
            print(f"  [{'ok' if check['ok'] else 'FAIL'}] {check['name']}: {check['detail']}")
        return 1

    failures: list[str] = []

    def expect(condition: bool, what: str) -> None:
        if not condition:
            failures.append(what)

    def expect_output(outcome: OfferOutcome, expected: str | re.Pattern[str], what: str) -> None:
        if (why := wrong_output(outcome, expected)) is not None:
            failures.append(f"{what}: {why}")

    print(f"edgecoder demo: {runners} sandboxed nodes, 1 node with SANDBOX_MODE=none, 1 offering laptop")
    async with contextlib.AsyncExitStack() as stack:
        # Fixed container labels: the demo's identities are new each run, so a demo that was killed leaves
        # containers that only a label it reuses can sweep at the next start.
        # node-1 also offers python-science (docs/runtimes.md), when this machine has built it (`make demo` does).
        science = science_runtime()
        plain_policy = ExecutorPolicy.from_env()
        science_policy = dataclasses.replace(plain_policy, runtimes=(science,))
        first = await stack.enter_async_context(
            MeshNode.open(
                NodeConfig(identity=NodeIdentity.generate(), node_label="demo-node-1", executor_policy=science_policy)
            )
        )
        bootstrap = first.addrs[:1]
        nodes = [first]
        for i in range(2, runners + 1):
            config = NodeConfig(identity=NodeIdentity.generate(), peers=bootstrap, node_label=f"demo-node-{i}")
            nodes.append(await stack.enter_async_context(MeshNode.open(config)))
        refuser = await stack.enter_async_context(
            MeshNode.open(NodeConfig(identity=NodeIdentity.generate(), peers=bootstrap, sandbox_mode="none"))
        )
        laptop = await stack.enter_async_context(
            MeshNode.open(NodeConfig(identity=NodeIdentity.generate(), peers=bootstrap, sandbox_mode="none"))
        )
        names = {n.identity.public_key: f"node-{i + 1}" for i, n in enumerate(nodes)}
        names[refuser.identity.public_key] = "no-sandbox"
        for i, n in enumerate(nodes):
            print(f"  node-{i + 1}     {n.peer_id}  sandboxMode={n.gate.reported_mode}")
        print(
            f"  no-sandbox {refuser.peer_id}  sandboxMode={refuser.gate.reported_mode} ({refuser.gate.status.reason})"
        )
        await laptop.wait_for_runner(timeout=10)
        with trio.move_on_after(5):
            while len(laptop.peers.fresh()) < runners + 1:
                await trio.sleep(0.05)
        seen = {h.peer_id: h.sandbox_mode for h in laptop.peers.fresh()}
        print(
            f"  the laptop has {len(seen)} neighbours' statuses (no flood: presence is between neighbours); "
            f"no-sandbox reports sandboxMode={seen.get(refuser.peer_id)}"
        )

        print("\nOffers that run (each in a fresh container: no network, read-only root, a uid of its own):")
        heard = heard_by(refuser)
        offer = laptop.make_offer(language="python", code=SUM_PY, input={"xs": list(range(1, 101))})
        outcome, ms = await _timed(lambda: laptop.offer_gossip(offer, timeout=30))
        _line("gossip offer, sealed, claimed by one", outcome, ms, names)
        ran = sum(n.ran.count(open_offer_id(offer)) for n in nodes)
        print(
            f"  {'':<36} └ ran on exactly {ran} node(s); claim requests {outcome.claim_requests} "
            f"(only invitees claim), refused {outcome.claims_refused}"
        )
        expect(outcome.ok and ran == 1, "the gossip offer runs exactly once")
        # The no-sandbox node is in the offers mesh and relays every offer: what did it see of this one?
        secrets = (SUM_PY.encode(), pack({"xs": list(range(1, 101))}))
        exposed = [data for data in heard if any(secret in data for secret in secrets)]
        terms = [parse_offer(data).offer.sealed for data in heard]
        print(
            f"  {'':<36} └ a listener on the offers topic received {len(heard)} pubsub message(s), "
            f"{sum(map(len, heard))} bytes, for a {len(SUM_PY) + len(secrets[1])}-byte payload"
        )
        if terms and terms[0] is not None:
            print(
                f"  {'':<36} └ it saw: sealed, code {terms[0].code_size} bytes, sha256 "
                f"{terms[0].code_digest.hex()[:16]}…, input {terms[0].input_size} bytes; "
                f"the code or input itself in {len(exposed)} of them"
            )
        expect(bool(heard) and not exposed and all(terms), "a listener never sees a sealed offer's code or input")
        expect_output(outcome, SUM_OF_1_TO_100, "the gossip offer sums 1 to 100")

        direct = laptop.make_offer(to=nodes[-1].peer_id, language="javascript", code=FIB_JS, input={"n": 90})
        outcome, ms = await _timed(lambda: laptop.offer_direct(nodes[-1].addrs[0], direct))
        _line("direct offer (javascript)", outcome, ms, names)
        expect_output(outcome, FIB_90, "the direct offer computes fib(90)")

        whoami = laptop.make_offer(
            to=nodes[0].peer_id, language="python", code=WHOAMI_PY, limits=Limits(timeout_ms=3000)
        )
        outcome, ms = await _timed(lambda: laptop.offer_direct(nodes[0].addrs[0], whoami))
        _line("what the sandbox looks like", outcome, ms, names)
        expect_output(outcome, WHOAMI, "the sandbox has only lo, and the run is not root")

        if ble:
            outcome, ms = await _timed(lambda: _ble_offer(nodes[0]))
            _line("BLE offer from a nearby laptop", outcome, ms, names)
            expect_output(outcome, BLE_HELLO, "the BLE offer says hello")

        assert first.executor is not None
        if science.name in first.executor.built_runtimes:
            needs = Needs(science.name)
            with trio.move_on_after(5):  # the laptop hears node-1's runtimes with its status
                while not laptop.runner_candidates(language="python", min_isolation=None, needs=needs):
                    await trio.sleep(0.05)
            invitable = laptop.runner_candidates(language="python", min_isolation=None, needs=needs)
            numpy_offer = laptop.make_offer(
                language="python", code=NUMPY_PY, input={"a": [[1, 2], [3, 4]]}, needs=needs
            )
            outcome, ms = await _timed(lambda: laptop.offer_gossip(numpy_offer, timeout=60))
            _line("numpy offer, needs python-science", outcome, ms, names)
            shown = ", ".join(names.get(public_key_of_peer_id(c.peer_id), c.peer_id) for c in invitable)
            print(f"  {'':<36} └ invitable: {shown} (the only node with the runtime; the others were skipped)")
            expect([c.peer_id for c in invitable] == [first.peer_id], "only node-1 is invited for python-science")
            expect_output(outcome, NUMPY_OUT, "the numpy offer multiplies the matrix on node-1")
        else:
            # `make demo` builds it first; `edgecoder demo` alone on a machine without it says so and goes on.
            print(f"  (no numpy offer: python-science is not built; edgecoder image build --runtime {science.name})")

        print("\nWhat the mesh refuses, and why:")

        async def expect_refused(title: str, to: MeshNode, raw: bytes, reason: str, what: str) -> None:
            outcome, ms = await _timed(lambda: laptop.offer_direct(to.addrs[0], raw))
            _line(title, outcome, ms, names, expected_refusal=True)
            expect(outcome.refusal is not None and outcome.refusal.reason == reason, what)

        await expect_refused(
            "direct offer to the no-sandbox node",
            refuser,
            laptop.make_offer(to=refuser.peer_id, language="python", code=SUM_PY),
            "sandbox_unavailable",
            "no-sandbox refuses",
        )
        host = laptop.make_offer(to=nodes[0].peer_id, language="python", code="print('on the host?')", sandbox="host")
        await expect_refused(
            "remote offer asking for the host",
            nodes[0],
            host,
            "sandbox_required_for_remote_task",
            "host execution is refused for remote work",
        )
        tampered = bytearray(laptop.make_offer(to=nodes[0].peer_id, language="python", code="print('tampered')"))
        tampered[-10] ^= 0x01
        await expect_refused("tampered offer", nodes[0], bytes(tampered), "bad_signature", "tampering is refused")
        await expect_refused("the direct offer, replayed", nodes[-1], direct, "replayed", "replays are refused")
        # Anyone who heard the gossip offer could send it straight to a node: its signed audience says "claimed".
        await expect_refused(
            "the gossip offer, re-sent directly", nodes[0], offer, "wrong_audience", "audiences are enforced"
        )
        await expect_refused(
            "a numpy offer to a node without python-science",
            nodes[-1],
            laptop.make_offer(to=nodes[-1].peer_id, language="python", code=NUMPY_PY, needs=Needs("python-science")),
            "runtime_unavailable",
            "a node refuses an offer whose runtime it has not built",
        )
        strong = laptop.make_offer(to=nodes[0].peer_id, language="python", code="print(1)", min_isolation="gvisor")
        await expect_refused(
            "an offer that needs gVisor, to runc",
            nodes[0],
            strong,
            "isolation_insufficient",
            "a node refuses an offer whose minimum sandbox tier it cannot meet",
        )

        taken = sum(refuser.intake.admitted.values())
        forwarded = refuser.gossip.stats["offer_forwarded_not_taken"]
        print(f"\n  no-sandbox node: ran {len(refuser.ran)} offers, took {taken}, forwarded {forwarded} for the mesh")
        expect(not refuser.ran and not taken, "the no-sandbox node takes no part")

    if failures:
        print("\nDEMO FAILED, what did not hold:")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print("\nEvery expectation held. Containers left behind: none (each node removes its own on exit).")
    return 0


def heard_by(node: MeshNode) -> list[bytes]:
    """The data of every pubsub message `node` receives from a peer from now on, any topic (a listener's view of
    gossip): what the demo shows of a sealed offer, and what tests/test_node_sealed.py checks for its marker."""
    heard: list[bytes] = []
    pubsub: Any = node.gossip.pubsub
    push = pubsub.push_msg

    async def listening(forwarder: Any, msg: Any) -> None:
        heard.append(bytes(msg.data))
        await push(forwarder, msg)

    pubsub.push_msg = listening
    return heard


def open_offer_id(raw: bytes) -> bytes:
    return parse_offer(raw).offer.offer_id


async def _ble_offer(node: MeshNode) -> OfferOutcome:
    """A nearby laptop advertises an offer over the simulated radio; the node's BLE central takes it."""
    from transports.ble.sim import open_simulated_radio

    neighbour = NodeIdentity.generate()
    offer = TaskOffer.create(neighbour, language="python", code=BLE_PY)
    async with open_simulated_radio() as radio, trio.open_nursery() as nursery:
        await nursery.start(node.run_ble, radio)
        peer = await radio.add_offering_peer(neighbour, offer.sign(neighbour))
        # The neighbour verified the result's signature against the claimant's PeerID before accepting it.
        result: TaskResult = await peer.wait_result()
        nursery.cancel_scope.cancel()
    return OfferOutcome(result=result)
