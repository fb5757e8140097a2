"""Prometheus metrics of one node. Each node has its own registry, so that many nodes can share one process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from executor.contract import ErrorKind, QueueReason
from transports.hardening.refusals import Refusal
from transports.wire.reasons import WIRE_REFUSALS

# Every transport that delivers offers, and the gossip validator, which refuses offers before they are forwarded.
TRANSPORTS = ("gossip", "direct", "ble", "coordinator")
REJECTING = (*TRANSPORTS, "gossip-validator")
CLAIM_OUTCOMES = ("granted", "refused")


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.offers = Counter("edgecoder_offers_admitted", "Offers admitted by the intake", ["transport"], registry=r)
        self.rejections = Counter(
            "edgecoder_offers_rejected",
            "Offers rejected, by transport and reason code",
            ["transport", "reason"],
            registry=r,
        )
        self.results = Counter(
            "edgecoder_results",
            "Runs finished, by error kind and queue reason",
            ["error_kind", "queue_reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "edgecoder_fallbacks", "Runs whose result asks to fall back to the cloud (queueForCloud)", registry=r
        )
        self.run_seconds = Histogram(
            "edgecoder_run_seconds",
            "Sandbox run durations",
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        # Gauges of live state are read at scrape time (set_function), so there is no copy to keep in step.
        self.pool_ready = Gauge("edgecoder_pool_ready", "Warm sandbox containers ready", registry=r)
        self.runs_in_flight = Gauge("edgecoder_runs_in_flight", "Sandbox runs holding a slot", registry=r)
        self.participating = Gauge("edgecoder_participating", "1 while the sandbox gate admits remote work", registry=r)
        self.queue_depth = Gauge("edgecoder_queue_depth", "Admitted offers waiting for a worker", registry=r)
        self.peers_connected = Gauge("edgecoder_peers_connected", "Peers with an open libp2p connection", registry=r)
        self.claims = Counter("edgecoder_claims", "Claims asked for, by outcome", ["outcome"], registry=r)
        self.job_failures = Counter(
            "edgecoder_job_failures",
            "Offers whose handling failed inside the node (answered execution-failed)",
            registry=r,
        )
        self.abandoned = Counter(
            "edgecoder_jobs_abandoned",
            "Admitted offers whose offerer stopped waiting (aborted or disconnected)",
            registry=r,
        )
        self.cancelled = Counter(
            "edgecoder_jobs_cancelled",
            "Jobs stopped by their offerer's signed cancel (queued, or running: the container killed)",
            registry=r,
        )

        self.connection_refusals = Counter(
            "edgecoder_connection_refusals",
            "Sockets, handshakes, connections and streams refused by the connection-level defences, by reason",
            ["reason"],
            registry=r,
        )

        # Label lookups cost microseconds, and the intake's budget per offer is tight: keep the children.
        self._admitted: dict[str, Any] = {}
        self._rejected: dict[tuple[str, str], Any] = {}
        # Every reason exists from the start, at zero: a dashboard can tell "never refused" from "not reported".
        self._connection_refused = {reason: self.connection_refusals.labels(str(reason)) for reason in Refusal}
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """Every known label value exists from the start, at 0, so that a fresh node's rate and ratio queries
        (the fallback rate, rejections by reason) return 0 rather than nothing."""
        for transport in TRANSPORTS:
            self._admitted[transport] = self.offers.labels(transport)
        for transport in REJECTING:
            for reason in sorted(WIRE_REFUSALS):
                self._rejected[(transport, str(reason))] = self.rejections.labels(transport, str(reason))
        for kind in ("none", *map(str, ErrorKind)):
            for queue_reason in ("none", *map(str, QueueReason)):
                self.results.labels(kind, queue_reason)
        for outcome in CLAIM_OUTCOMES:
            self.claims.labels(outcome)

    def offer_admitted(self, transport: str) -> None:
        child = self._admitted.get(transport)
        if child is None:
            child = self._admitted[transport] = self.offers.labels(transport)
        child.inc()

    def offer_rejected(self, transport: str, reason: str) -> None:
        child = self._rejected.get((transport, reason))
        if child is None:
            child = self._rejected[(transport, reason)] = self.rejections.labels(transport, reason)
        child.inc()

    def connection_refused(self, reason: Refusal) -> None:
        """The `on_refusal` sink of `transports.p2p.open_host`."""
        self._connection_refused[reason].inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
