"""libp2p's resource manager as `open_host` configures it, over real loopback connections: each limit it enforces,
and the rcmgr bugs kept out of the way (each shown on a stock configuration first)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.rcmgr import ResourceLimits, ResourceManager
from libp2p.rcmgr.connection_limits import ConnectionLimits

from tests.hardening_support import (
    LOOPBACK,
    RefusalLog,
    build_stock_host,
    dial_from,
    disconnect_all,
    full_addr,
    running,
    stock_host,
)
from tests.test_p2p_fakes import run_trio, wait_until
from transports.hardening import ConnectionBudget, Defences, Refusal
from transports.p2p import P2PHost, open_host
from transports.wire.identity import NodeIdentity

HONEST = "127.0.0.1"


@asynccontextmanager
async def node_with(budget: ConnectionBudget) -> AsyncIterator[tuple[P2PHost, RefusalLog]]:
    refusals = RefusalLog()
    defences = Defences(connections=budget)
    async with open_host(NodeIdentity.generate(), [LOOPBACK], defences=defences, on_refusal=refusals) as node:
        yield node, refusals


def rcmgr_of(host: IHost) -> Any:
    return host.get_network()._resource_manager  # type: ignore[attr-defined]


async def dial_and_settle(client: IHost, node: P2PHost | IHost) -> bool:
    """Dial `node`; True when it registered the connection, False when it refused it (then the client's session
    is closed by the node: a refusal in `add_conn` comes after the handshake)."""
    server = node.host if isinstance(node, P2PHost) else node
    try:
        conn = await dial_from(client, HONEST, full_addr(server))
    except Exception:
        return False
    await wait_until(
        lambda: conn.is_closed or client.get_id() in server.get_connected_peers(), what="the node to decide"
    )
    return not conn.is_closed


async def peers(stack: AsyncExitStack, count: int, identity: NodeIdentity | None = None) -> list[IHost]:
    return [await stack.enter_async_context(running(build_stock_host(identity))) for _ in range(count)]


def test_established_inbound_connections_are_capped() -> None:
    async def main() -> None:
        async with node_with(ConnectionBudget(max_inbound=3)) as (node, refusals), AsyncExitStack() as stack:
            clients = await peers(stack, 5)
            kept = [await dial_and_settle(c, node) for c in clients]
            assert kept == [True, True, True, False, False]
            assert len(node.connected_peers()) == 3
            await wait_until(lambda: refusals == {Refusal.CONNECTION_LIMIT: 2})
            assert rcmgr_of(node.host)._current_connections == 3  # refused scopes released (the leak fixed)

    run_trio(main)


def test_a_valued_peer_gets_a_place_when_strangers_hold_them_all() -> None:
    """Found by bench_attacks' "fresh peers, 231 held": with strangers holding every inbound place, the honest
    offerer dialling afresh was refused now and then. A valued peer (for a node, an offerer it has served) now
    gets the place of the newest stranger with nothing in progress; a newcomer who is not valued is refused."""

    async def main() -> None:
        async with node_with(ConnectionBudget(max_inbound=3)) as (node, refusals), AsyncExitStack() as stack:
            strangers = await peers(stack, 3)
            valued, busy_one = await peers(stack, 2)
            in_progress = {strangers[-1].get_id().to_base58()}  # the newest stranger has an exchange going
            node.value_peers(lambda peer: peer == valued.get_id().to_base58(), lambda: in_progress)
            assert [await dial_and_settle(c, node) for c in strangers] == [True, True, True]
            assert not await dial_and_settle(busy_one, node)  # not valued: refused like anyone
            assert await dial_and_settle(valued, node)
            connected = set(node.connected_peers())
            kept = {strangers[0].get_id().to_base58(), *in_progress, valued.get_id().to_base58()}
            await wait_until(lambda: set(node.connected_peers()) == kept, what="the middle stranger closed")
            assert node.host.get_network().evicted == 1  # type: ignore[attr-defined]
            assert refusals[Refusal.CONNECTION_LIMIT] == 1, connected
            # With every stranger busy or valued, there is nobody to close: the valued peer is refused too.
            in_progress.update(p for p in node.connected_peers())
            second = (await peers(stack, 1))[0]
            node.value_peers(lambda peer: True, lambda: in_progress)
            assert not await dial_and_settle(second, node)

    run_trio(main)


def test_established_connections_in_total_are_capped() -> None:
    async def main() -> None:
        budget = ConnectionBudget(max_inbound=4, max_outbound=4, total=3)
        async with node_with(budget) as (node, refusals), AsyncExitStack() as stack:
            server = await stack.enter_async_context(stock_host())
            await node.connect(full_addr(server))  # one outbound
            clients = await peers(stack, 3)
            kept = [await dial_and_settle(c, node) for c in clients]
            assert kept == [True, True, False]
            assert len(node.connected_peers()) == 3
            await wait_until(lambda: refusals == {Refusal.CONNECTION_LIMIT: 1})

    run_trio(main)


def test_connections_per_peer_are_capped() -> None:
    async def main() -> None:
        async with node_with(ConnectionBudget(max_per_peer=1)) as (node, refusals), AsyncExitStack() as stack:
            twins = await peers(stack, 2, NodeIdentity.generate())  # two hosts, one key
            assert await dial_and_settle(twins[0], node)
            assert not await dial_and_settle(twins[1], node)
            await wait_until(lambda: refusals == {Refusal.CONNECTION_LIMIT: 1})
            assert len(node.host.get_network().connections[twins[0].get_id()]) == 1
            assert node.host.get_id() in twins[0].get_connected_peers()  # the first connection is untouched

    run_trio(main)


def test_reconnects_of_one_key_are_rate_limited() -> None:
    async def main() -> None:
        budget = ConnectionBudget(peer_rate=0.001, peer_burst=3)  # three, then (practically) none
        async with node_with(budget) as (node, refusals), stock_host(listen=()) as client:
            kept = []
            for _ in range(6):
                kept.append(await dial_and_settle(client, node))
                await disconnect_all(client)
                await wait_until(lambda: not node.connected_peers(), what="the node to drop the connection")
            assert kept == [True, True, True, False, False, False]
            await wait_until(lambda: refusals == {Refusal.PEER_RATE: 3})
            async with stock_host(listen=()) as other:  # another key is not affected
                assert await dial_and_settle(other, node)

    run_trio(main)


def test_stock_rcmgr_leaks_a_connection_unit_per_limit_refusal() -> None:
    """A pin of upstream's scope leak: `add_conn` refuses without closing the scope the upgrade attached."""

    async def main() -> None:
        manager = ResourceManager(
            limits=ResourceLimits(max_connections=10),
            connection_limits=ConnectionLimits(max_established_inbound=1),
            enable_graceful_degradation=False,
        )
        async with stock_host(resource_manager=manager) as server, AsyncExitStack() as stack:
            keeper, *extras = await peers(stack, 5)
            assert await dial_and_settle(keeper, server)
            for extra in extras:
                assert not await dial_and_settle(extra, server)
            assert len(server.get_connected_peers()) == 1
            assert manager._current_connections == 1 + 4

    run_trio(main)


def test_our_swarm_releases_the_unit_of_each_refused_connection() -> None:
    async def main() -> None:
        async with node_with(ConnectionBudget(max_inbound=1)) as (node, refusals), AsyncExitStack() as stack:
            keeper, *extras = await peers(stack, 5)
            assert await dial_and_settle(keeper, node)
            for extra in extras:
                assert not await dial_and_settle(extra, node)
            await wait_until(lambda: refusals == {Refusal.CONNECTION_LIMIT: 4})
            manager = rcmgr_of(node.host)
            assert manager._current_connections == 1
            await disconnect_all(keeper)
            await wait_until(lambda: manager._current_connections == 0, what="the keeper's unit to be released")

    run_trio(main)


async def concurrent_dials(node: P2PHost | IHost, count: int) -> int:
    """`count` fresh peers dial at once; how many of them are still connected once the node decided."""
    async with AsyncExitStack() as stack:
        clients = await peers(stack, count)
        kept: list[bool] = []

        async def one(client: IHost) -> None:
            kept.append(await dial_and_settle(client, node))

        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(one, client)
        return sum(kept)


def test_stock_rcmgr_counts_each_handshake_twice_and_refuses_concurrent_ones() -> None:
    """A pin: with a global limit of 6, six concurrent handshakes do not all get in (the pre-handshake and the
    post-handshake scopes are both held while the second is taken). Ours keeps that counter out of reach."""

    async def main() -> None:
        manager = ResourceManager(limits=ResourceLimits(max_connections=6), enable_graceful_degradation=False)
        async with stock_host(resource_manager=manager) as server:
            assert await concurrent_dials(server, 6) < 6

    run_trio(main)


def test_concurrent_handshakes_up_to_the_inbound_cap_all_get_in() -> None:
    async def main() -> None:
        async with node_with(ConnectionBudget(max_inbound=6)) as (node, refusals):
            assert await concurrent_dials(node, 6) == 6
            assert refusals == {}

    run_trio(main)


def test_stock_rcmgr_shrinks_its_limits_under_pressure_and_ours_does_not() -> None:
    """Graceful degradation (on by default) lowers a limit by 20% per exhaustion event: an attack that exhausts
    the node once leaves it smaller for honest peers. A pin of why ours turns it off."""
    stock = ResourceManager(limits=ResourceLimits(max_connections=5))
    while stock.acquire_connection("", direction="inbound"):
        pass
    assert stock.limits.max_connections < 5

    ours = Defences().resource_manager()
    assert ours.graceful_degradation is None and ours.circuit_breaker is None
    for _ in range(1000):
        assert ours.acquire_connection("", direction="inbound")
    assert ours.limits.max_connections == 1 << 30
