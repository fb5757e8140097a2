"""Admission by source, as a state machine: properties over any sequence of sockets, handshakes, closes and time."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from transports.hardening.admission import UNKNOWN_SOURCE, AdmissionLimits, SourceAdmission, Ticket, source_key
from transports.hardening.refusals import Refusal

SOURCES = ["10.0.0.1", "10.0.0.2", "2001:db8::1", "2001:db8::2", "2001:db8:0:1::1", None]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class AdmissionMachine(RuleBasedStateMachine):
    """A model of what admission must guarantee, checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.limits = AdmissionLimits(max_pending=4, max_per_source=3, source_rate=2.0, source_burst=3.0, max_held=2)
        self.admission = SourceAdmission(self.limits, clock=self.clock)
        self.tickets: list[Ticket] = []  # every ticket ever issued, oldest first
        self.evicted: list[Ticket] = []
        self.admitted_at: dict[str, list[float]] = {}
        self.held = 0

    def _on_evict(self, ticket: Ticket) -> None:
        # The evicted ticket must be the oldest still pending.
        pending = [t for t in self.tickets if t.pending or t is ticket]
        assert pending[0] is ticket
        self.evicted.append(ticket)

    @rule(ip=st.sampled_from(SOURCES))
    def socket_accepted(self, ip: str | None) -> None:
        source = source_key(ip)
        live_before = self.admission.live(source)
        verdict = self.admission.admit(ip)
        if isinstance(verdict, Ticket):
            assert verdict.source == source
            verdict.on_evict = lambda t=verdict: self._on_evict(t)
            self.tickets.append(verdict)
            self.admitted_at.setdefault(source, []).append(self.clock.now)
        elif verdict is Refusal.SOURCE_CONCURRENCY:
            assert live_before == self.limits.max_per_source
        else:
            assert verdict is Refusal.SOURCE_RATE

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(min_value=0), twice=st.booleans())
    def handshake_finished(self, index: int, twice: bool) -> None:
        ticket = self.tickets[index % len(self.tickets)]
        ticket.handshake_done()
        if twice:
            ticket.handshake_done()

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(min_value=0), twice=st.booleans())
    def connection_closed(self, index: int, twice: bool) -> None:
        ticket = self.tickets[index % len(self.tickets)]
        ticket.release()
        if twice:
            ticket.release()

    @rule()
    def refused_socket_held(self) -> None:
        if self.admission.hold():
            self.held += 1
        else:
            assert self.held == self.limits.max_held

    @precondition(lambda self: self.held)
    @rule()
    def held_socket_closed(self) -> None:
        self.admission.unhold()
        self.held -= 1

    @invariant()
    def held_sockets_are_bounded_and_exact(self) -> None:
        assert self.admission.held == self.held <= self.limits.max_held

    @rule(seconds=st.floats(min_value=0, max_value=3))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    @invariant()
    def pending_is_bounded_and_exact(self) -> None:
        assert self.admission.pending <= self.limits.max_pending
        assert self.admission.pending == sum(t.pending for t in self.tickets)

    @invariant()
    def live_per_source_is_bounded_and_exact(self) -> None:
        for source in {source_key(ip) for ip in SOURCES}:
            live = sum(1 for t in self.tickets if t.source == source and not t._released)
            assert self.admission.live(source) == live <= self.limits.max_per_source

    @invariant()
    def evicted_tickets_are_marked_and_no_longer_pending(self) -> None:
        for ticket in self.evicted:
            assert ticket.evicted and not ticket.pending
        assert sum(t.evicted for t in self.tickets) == len(self.evicted)

    @invariant()
    def no_source_is_admitted_faster_than_its_bucket(self) -> None:
        for times in self.admitted_at.values():
            for i, start in enumerate(times):
                for j in range(i, len(times)):
                    admitted = j - i + 1
                    assert admitted <= self.limits.source_burst + self.limits.source_rate * (times[j] - start) + 1e-9

    def teardown(self) -> None:
        for ticket in self.tickets:
            ticket.release()
        assert self.admission.pending == 0
        assert self.admission.sources == 0


TestAdmission = AdmissionMachine.TestCase
TestAdmission.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


@given(st.integers(min_value=0, max_value=2**128 - 1), st.integers(min_value=0, max_value=2**64 - 1))
def test_every_address_of_one_ipv6_slash_64_is_one_source(network: int, host: int) -> None:
    prefix = network >> 64 << 64
    a = ipaddress.IPv6Address(prefix | host)
    b = ipaddress.IPv6Address(prefix | (host ^ 0xFFFF))
    if a.ipv4_mapped is None and b.ipv4_mapped is None:
        assert source_key(str(a)) == source_key(str(b)) == str(ipaddress.IPv6Network((prefix, 64)))


@given(st.integers(min_value=0, max_value=2**64 - 2))
def test_different_ipv6_slash_64s_are_different_sources(network: int) -> None:
    a = ipaddress.IPv6Address(network << 64 | 1)
    b = ipaddress.IPv6Address((network + 1) << 64 | 1)
    assert source_key(str(a)) != source_key(str(b))


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_is_its_own_source_also_when_mapped_into_ipv6(addr: ipaddress.IPv4Address) -> None:
    assert source_key(str(addr)) == str(addr)
    assert source_key(f"::ffff:{addr}") == str(addr)


@given(st.text(max_size=40).filter(lambda t: not _is_ip(t)))
def test_anything_else_shares_the_unknown_source(text: str) -> None:
    assert source_key(text) == UNKNOWN_SOURCE
    assert source_key(None) == UNKNOWN_SOURCE


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


def test_token_buckets_are_kept_for_a_bounded_number_of_sources() -> None:
    admission = SourceAdmission(AdmissionLimits(max_tracked_sources=100), clock=Clock())
    for i in range(5000):
        ticket = admission.admit(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        assert isinstance(ticket, Ticket)
        ticket.release()
    assert admission.tracked_sources == 100
    assert admission.sources == 0 and admission.pending == 0


@pytest.mark.parametrize(
    "limits",
    [
        {"max_pending": 0},
        {"max_per_source": 0},
        {"max_tracked_sources": 0},
        {"source_rate": 0},
        {"source_burst": 0.5},
        {"max_held": -1},
        {"hold_seconds": -1},
    ],
)
def test_limits_that_admit_nothing_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdmissionLimits(**limits)  # type: ignore[arg-type]
