"""Whom an offerer invites to claim a gossip offer, and which runners a node tells its neighbours about.

Claims used to be open: every idle runner that heard an offer asked for it, so claims per offer grew with the mesh
(about 500 claim streams for one offer at 1,000 nodes). Now the offerer names `INVITEES` candidates in the signed
offer, sampled from the presence it knows (`mesh.peers`): its neighbours first hand, and the runners they report one
hop further. Everyone else refuses the offer at once (`not_invited`) and only forwards it. Claim requests per offer
are then at most the number invited, whatever the mesh's size; an issue nobody claims in time is re-issued to
others (`MeshNode.offer_gossip`), so a dead or busy invitee costs time, not the offer.

Why invitations, against the alternatives of issue 13: a claim back-off with a "taken" notice still lets every
node claim when the notice is late, and costs a flood per offer; capacity tokens need an issuer. Golem bounds its
broadcast to a few neighbours but has no exactly-once claim; Bacalhau's orchestrator chooses nodes centrally. An
offerer that chooses from its own neighbourhood keeps exactly-once claims without a central party.

Both choices are I/O-free and deterministic given their inputs (and the `random.Random` passed in).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mesh.peers import NEAR_SAMPLE, NearRunner, PeerDirectory
from transports.wire.needs import DEFAULT_RUNTIME, Needs, unmet_by
from transports.wire.offers import MAX_INVITEES, meets

# Two invitees: one spare if the other is busy or gone, and a mean of at most two claim requests per offer.
INVITEES = 2


@dataclass(frozen=True, slots=True)
class Candidate:
    peer_id: str
    first_hand: bool
    free: bool  # first hand only: it said it has a free slot; a second-hand runner's load is unknown


def candidates(
    directory: PeerDirectory,
    *,
    language: str | None,
    min_isolation: str | None,
    me: str,
    needs: Needs | None = None,
) -> list[Candidate]:
    """Runners that could take this offer: sandboxing, with a tier that meets its minimum, its language (None:
    any), and what it needs (its runtime, by digest too, and its resources: transports/wire/needs.py). Neighbours
    are judged on their whole advertisement; runners one hop away on their runtimes' names only (the claim's own
    status is judged in full by the offerer), so that invitations skip the nodes that lack the runtime."""
    needs = needs or Needs()

    def fits(languages: tuple[str, ...], tiers: tuple[str, ...]) -> bool:
        speaks = language is None or not languages or language in languages
        return speaks and any(meets(t, min_isolation) for t in tiers)

    def has_runtime(runtimes: tuple[str, ...] | None) -> bool:
        return needs.runtime_name in (runtimes if runtimes is not None else (DEFAULT_RUNTIME,))

    found = [
        Candidate(h.peer_id, True, h.free_slots > 0)
        for h in directory.fresh()
        if h.peer_id != me
        and h.runs_offers
        and fits(h.languages, h.isolation)
        and unmet_by(h.capabilities, needs) is None
    ]
    found += [
        Candidate(n.peer_id, False, False)
        for n in directory.near(exclude=(me,))
        if fits(n.languages, n.isolation) and has_runtime(n.runtimes)
    ]
    return found


def choose_invitees(
    found: Iterable[Candidate],
    *,
    strikes: Callable[[str], int],
    exclude: Iterable[str] = (),
    k: int = INVITEES,
    rng: random.Random | None = None,
) -> list[str]:
    """Up to `k` PeerIDs, best first: fewest strikes with this offerer, then neighbours with a free slot, then the
    runners one hop away, then busy neighbours; shuffled within each rank, so that offerers spread their work."""
    rng = rng or random.Random()
    skip = set(exclude)
    pool = [c for c in found if c.peer_id not in skip]
    rng.shuffle(pool)  # the sort is stable: candidates of one rank stay in random order
    pool.sort(key=lambda c: (strikes(c.peer_id), 0 if c.first_hand and c.free else 1 if not c.first_hand else 2))
    chosen = list(dict.fromkeys(c.peer_id for c in pool))  # one place each, in rank order
    return chosen[: max(0, min(k, MAX_INVITEES))]


def near_sample(directory: PeerDirectory, me: str, limit: int = NEAR_SAMPLE) -> list[NearRunner]:
    """The runners among this node's fresh neighbours that it tells its other neighbours about.

    Stable (ranked by a hash of our PeerID and theirs, not drawn at random), so that the sample, and with it our
    status, changes only when a runner comes, goes or changes what it runs: a status change is pushed to every
    neighbour. Different for each node, so that the samples of a neighbourhood cover more of it.
    """
    runners = [h for h in directory.fresh() if h.peer_id != me and h.runs_offers]
    runners.sort(key=lambda h: hashlib.sha256(f"{me}/{h.peer_id}".encode()).digest())
    return [NearRunner(h.peer_id, h.languages, h.isolation, via=me, runtimes=h.runtime_names) for h in runners[:limit]]
