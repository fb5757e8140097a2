"""Replay memory: spent ids stay spent until their offer expires, per offerer, within bounds, across restarts."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.replay import ReplayMemory

A, B = b"a" * 32, b"b" * 32


class WallClock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def ident(n: int) -> bytes:
    return n.to_bytes(16, "big")


def test_an_id_is_forgotten_exactly_when_its_offer_would_fail_the_clock_check() -> None:
    clock = WallClock()
    memory = ReplayMemory(per_offerer=10, capacity=10, now_ms=clock)
    memory.spend(A, ident(1), clock.ms + 500)
    clock.ms += 499
    assert memory.seen(A, ident(1)) and not memory.seen(B, ident(1))
    clock.ms += 1
    assert not memory.seen(A, ident(1)) and len(memory) == 0


def test_each_offerer_has_its_own_share_and_a_full_memory_has_no_room() -> None:
    clock = WallClock()
    memory = ReplayMemory(per_offerer=2, capacity=3, now_ms=clock)
    for n in range(2):
        memory.spend(A, ident(n), clock.ms + 10_000)
    assert not memory.has_room(A) and memory.has_room(B)
    memory.spend(B, ident(9), clock.ms + 10_000)
    assert not memory.has_room(B)  # the whole memory is full, B's share is not
    assert all(memory.seen(A, ident(n)) for n in range(2)) and memory.seen(B, ident(9))
    clock.ms += 10_000
    assert memory.has_room(A) and memory.has_room(B) and len(memory) == 0


def test_spent_ids_survive_a_restart_and_expired_ones_are_compacted_away(tmp_path: Path) -> None:
    clock = WallClock()
    journal = tmp_path / "replay"
    memory = ReplayMemory(per_offerer=100, capacity=100, now_ms=clock, journal=journal)
    memory.spend(A, ident(1), clock.ms + 60_000)
    memory.spend(B, ident(2), clock.ms + 1_000)
    memory.close()
    clock.ms += 2_000
    restarted = ReplayMemory(per_offerer=100, capacity=100, now_ms=clock, journal=journal)
    assert restarted.seen(A, ident(1)) and not restarted.seen(B, ident(2))
    assert journal.stat().st_size == 56  # one live record of 56 bytes after compaction
    restarted.close()


def test_a_torn_last_record_is_dropped(tmp_path: Path) -> None:
    clock = WallClock()
    journal = tmp_path / "replay"
    memory = ReplayMemory(per_offerer=10, capacity=10, now_ms=clock, journal=journal)
    memory.spend(A, ident(1), clock.ms + 60_000)
    memory.close()
    with journal.open("ab") as f:
        f.write(b"\x01" * 20)  # a crash in the middle of the next write
    restarted = ReplayMemory(per_offerer=10, capacity=10, now_ms=clock, journal=journal)
    assert restarted.seen(A, ident(1)) and len(restarted) == 1
    restarted.close()


def test_the_journal_is_compacted_as_it_grows(tmp_path: Path) -> None:
    clock = WallClock()
    journal = tmp_path / "replay"
    memory = ReplayMemory(per_offerer=10, capacity=10, now_ms=clock, journal=journal)
    for n in range(5000):
        memory.spend(A, ident(n), clock.ms + 1)  # each expires at the next tick
        clock.ms += 1
    assert journal.stat().st_size < 56 * 2000
    memory.close()


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from([A, B]), st.integers(0, 30), st.integers(1, 50), st.integers(0, 20))))
def test_never_forgets_an_unexpired_id_and_never_exceeds_its_bounds(ops: list[tuple[bytes, int, int, int]]) -> None:
    clock = WallClock()
    memory = ReplayMemory(per_offerer=5, capacity=8, now_ms=clock)
    model: dict[tuple[bytes, int], int] = {}
    for offerer, n, life, advance in ops:
        clock.ms += advance
        model = {k: v for k, v in model.items() if v > clock.ms}
        assert all(memory.seen(o, ident(i)) for (o, i) in model)
        if memory.seen(offerer, ident(n)) or not memory.has_room(offerer):
            continue
        memory.spend(offerer, ident(n), clock.ms + life)
        model[(offerer, n)] = clock.ms + life
        assert len(memory) <= 8 and sum(1 for (o, _) in model if o == offerer) <= 5
