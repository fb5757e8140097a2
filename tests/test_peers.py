"""The peer directory against a naive model: bounded, the least recently heard peer goes first, fresh means fresh."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mesh.peers import PeerDirectory


def beat(peer: str) -> dict[str, object]:
    return {"peerId": peer, "sandboxMode": "docker", "freeSlots": 1, "languages": [], "addrs": []}


@given(st.lists(st.tuples(st.integers(0, 12), st.floats(0, 4)), max_size=200), st.integers(1, 6))
def test_matches_a_naive_model(ops: list[tuple[int, float]], capacity: int) -> None:
    now = [0.0]
    directory = PeerDirectory(stale_after=5.0, capacity=capacity, monotonic=lambda: now[0])
    model: dict[str, tuple[float, int]] = {}  # peer -> (seen at, order of observation)
    for order, (peer_number, advance) in enumerate(ops):
        now[0] += advance
        peer = f"peer-{peer_number}"
        directory.observe(peer, beat(peer))
        model[peer] = (now[0], order)
        while len(model) > capacity:
            del model[min(model, key=lambda p: model[p][1])]
        assert len(directory) == len(model) <= capacity
        fresh = {h.peer_id for h in directory.fresh()}
        assert fresh == {p for p, (seen, _) in model.items() if now[0] - seen <= 5.0}
        assert all(directory.get(p) is not None for p in fresh)


def test_eviction_is_constant_time_per_observation() -> None:
    directory = PeerDirectory(capacity=1000)
    for n in range(200_000):  # was a scan of all 1000 entries per new peer
        directory.observe(f"p{n}", beat(f"p{n}"))
    assert len(directory) == 1000
