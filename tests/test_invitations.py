"""Whom an offerer invites: properties of the choice, over arbitrary presence and strikes."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mesh.invitations import Candidate, candidates, choose_invitees, near_sample
from mesh.peers import NEAR_SAMPLE, PeerDirectory
from transports.wire.needs import Needs
from transports.wire.offers import ISOLATION_TIERS, MAX_INVITEES, meets

ME = "12D3KooWme"
PEERS = [f"12D3KooWpeer{i:02d}" for i in range(24)]

statuses = st.fixed_dictionaries(
    {
        "sandboxMode": st.sampled_from(["docker", "none"]),
        "freeSlots": st.integers(0, 3),
        "languages": st.sampled_from([[], ["python"], ["javascript"], ["python", "javascript"]]),
        "isolation": st.sampled_from([[], ["runc"], ["gvisor"], ["runc", "gvisor"]]),
        "near": st.lists(
            st.fixed_dictionaries(
                {
                    "peerId": st.sampled_from(PEERS),
                    "languages": st.sampled_from([[], ["python"]]),
                    "isolation": st.sampled_from([["runc"], ["gvisor"]]),
                }
            ),
            max_size=NEAR_SAMPLE,
        ),
    }
)


def directory_of(neighbours: dict[str, dict[str, Any]]) -> PeerDirectory:
    directory = PeerDirectory(stale_after=60)
    for peer_id, status in neighbours.items():
        directory.observe(peer_id, {"peerId": peer_id, "addrs": [], **status})
    return directory


@given(
    st.dictionaries(st.sampled_from(PEERS), statuses, max_size=12),
    st.sampled_from(["python", "javascript"]),
    st.none() | st.sampled_from(ISOLATION_TIERS),
)
def test_candidates_are_runners_that_fit_the_offer_and_never_ourselves(
    neighbours: dict[str, dict[str, Any]], language: str, minimum: str | None
) -> None:
    directory = directory_of(neighbours)
    found = candidates(directory, language=language, min_isolation=minimum, me=ME)
    first_hand = {c.peer_id for c in found if c.first_hand}
    for candidate in found:
        assert candidate.peer_id != ME
        if candidate.first_hand:
            status = neighbours[candidate.peer_id]
            assert status["sandboxMode"] == "docker"
            assert not status["languages"] or language in status["languages"]
            assert any(meets(t, minimum) for t in status["isolation"])
            assert candidate.free == (status["freeSlots"] > 0)
        else:
            assert candidate.peer_id not in neighbours  # a neighbour is known first hand, not through others
            assert not candidate.free
    # Every fitting runner neighbour is a candidate.
    fitting = {
        p
        for p, s in neighbours.items()
        if s["sandboxMode"] == "docker"
        and s["isolation"]
        and (not s["languages"] or language in s["languages"])
        and any(meets(t, minimum) for t in s["isolation"])
    }
    assert first_hand == fitting


pools = st.lists(
    st.builds(Candidate, st.sampled_from(PEERS), st.booleans(), st.booleans()),
    max_size=20,
    unique_by=lambda c: c.peer_id,
)


@given(
    pools,
    st.dictionaries(st.sampled_from(PEERS), st.integers(1, 3)),
    st.sets(st.sampled_from(PEERS)),
    st.integers(0, 10),
)
def test_the_choice_is_bounded_distinct_new_and_prefers_the_unstruck_and_the_free(
    pool: list[Candidate], strikes: dict[str, int], exclude: set[str], k: int
) -> None:
    chosen = choose_invitees(pool, strikes=lambda p: strikes.get(p, 0), exclude=exclude, k=k, rng=random.Random(1))
    eligible = [c for c in pool if c.peer_id not in exclude]
    assert len(chosen) == min(k, MAX_INVITEES, len(eligible))
    assert len(set(chosen)) == len(chosen) and not set(chosen) & exclude
    left_out = [c for c in eligible if c.peer_id not in chosen]
    rank = {
        c.peer_id: (strikes.get(c.peer_id, 0), 0 if c.first_hand and c.free else 1 if not c.first_hand else 2)
        for c in eligible
    }
    for peer in chosen:
        assert all(rank[peer] <= rank[other.peer_id] for other in left_out)


def test_offerers_spread_their_invitations_over_equally_good_runners() -> None:
    pool = [Candidate(p, True, True) for p in PEERS[:10]]
    seen = {p for seed in range(40) for p in choose_invitees(pool, strikes=lambda _: 0, rng=random.Random(seed))}
    assert len(seen) >= 8


@given(st.dictionaries(st.sampled_from(PEERS), statuses, max_size=16))
def test_the_near_sample_is_stable_bounded_and_only_runners(neighbours: dict[str, dict[str, Any]]) -> None:
    directory = directory_of(neighbours)
    sample = near_sample(directory, ME)
    assert len(sample) <= NEAR_SAMPLE
    for runner in sample:
        assert neighbours[runner.peer_id]["sandboxMode"] == "docker" and neighbours[runner.peer_id]["isolation"]
    assert [r.peer_id for r in near_sample(directory, ME)] == [r.peer_id for r in sample]
    # Free slots coming and going do not change it: only runners coming, going or changing what they run do.
    for peer_id, status in neighbours.items():
        directory.observe(peer_id, {"peerId": peer_id, "addrs": [], **status, "freeSlots": 0})
    assert [r.peer_id for r in near_sample(directory, ME)] == [r.peer_id for r in sample]


def test_invitations_skip_runners_that_lack_the_runtime() -> None:
    """First hand by the whole advertisement (a digest too), one hop away by the runtime's name; a node from
    before runtimes runs python only."""
    science = "cd" * 32

    def caps(*runtimes: str, digest: str = science) -> dict[str, Any]:
        return {
            "runtimes": [{"name": r, "digest": digest} for r in runtimes],
            "resources": {"cores": 1, "memoryMb": 512, "arch": "x86_64", "gpu": "none"},
        }

    runner = {"sandboxMode": "docker", "freeSlots": 1, "languages": [], "isolation": ["runc"]}
    directory = directory_of(
        {
            PEERS[0]: {**runner, "capabilities": caps("python", "python-science")},
            PEERS[1]: {**runner, "capabilities": caps("python")},
            PEERS[2]: {**runner, "capabilities": caps("python", "python-science", digest="ef" * 32)},
            PEERS[3]: {
                **runner,
                "near": [
                    {"peerId": PEERS[10], "languages": [], "isolation": ["runc"], "runtimes": ["python-science"]},
                    {"peerId": PEERS[11], "languages": [], "isolation": ["runc"], "runtimes": ["python"]},
                    {"peerId": PEERS[12], "languages": [], "isolation": ["runc"]},
                ],
            },
        }
    )

    def found(needs: Needs) -> set[str]:
        return {c.peer_id for c in candidates(directory, language="python", min_isolation=None, me=ME, needs=needs)}

    assert found(Needs("python-science")) == {PEERS[0], PEERS[2], PEERS[10]}
    assert found(Needs("python-science", science)) == {PEERS[0], PEERS[10]}
    assert found(Needs()) == {PEERS[0], PEERS[1], PEERS[2], PEERS[3], PEERS[11], PEERS[12]}
    # A runner passes its neighbours' runtimes on, so that the next hop can skip them too.
    passed_on = {n.peer_id: n.runtimes for n in near_sample(directory, PEERS[5])}
    assert passed_on[PEERS[0]] == ("python", "python-science") and passed_on[PEERS[3]] is None
