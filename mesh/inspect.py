"""`edgecoder status`, `peers` and `jobs` for a person: the node's `/status` JSON as short aligned text.

Pure functions of the JSON, so that what a person reads and what `--json` prints cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def format_status(status: dict[str, Any]) -> str:
    peers = status.get("peers", [])
    connected = [p for p in peers if p.get("connected")]
    jobs = status.get("jobs", [])
    answered = [j for j in jobs if j.get("state") == "answered"]
    gate = status.get("gate", {})
    gate_text = f"{gate.get('reason')}: {gate['detail']}" if gate.get("detail") else str(gate.get("reason"))
    taking = "takes part" if status.get("participating") else f"does NOT take part ({status.get('reason')})"
    lines = [
        f"node      {status['peerId']}",
        f"          {taking}",
        f"sandbox   {status.get('sandboxMode')} ({gate_text}), isolation {status.get('isolation')}",
        f"runs      {status.get('runsInFlight', 0)} in flight of {status.get('maxConcurrent', 0)} slots, "
        f"{status.get('poolReady', 0)} warm containers",
        f"queue     {status.get('queueDepth', 0)} waiting of {status.get('queueSize', 0)}",
        f"peers     {len(connected)} connected, {len(peers) - len(connected)} more heard of",
        f"jobs      {len(jobs)} recent: {sum(1 for j in answered if j.get('ok'))} ok, "
        f"{sum(1 for j in answered if not j.get('ok'))} failed or refused, {len(jobs) - len(answered)} other",
    ]
    for tier, check in (gate.get("tiers") or {}).items():
        verdict = "proven" if check.get("ok") else f"WITHDRAWN ({check.get('reason')}: {check.get('detail')})"
        lines.append(f"tier      {tier}: {verdict}")
    addrs = status.get("addrs", [])
    lines.append("addrs     " + (addrs[0] if addrs else "(none)"))
    lines += [f"          {a}" for a in addrs[1:]]
    return "\n".join(lines)


def format_peers(status: dict[str, Any]) -> str:
    peers = status.get("peers", [])
    if not peers:
        return f"{status['peerId']} has no peers: no connection, and no status heard"
    rows = []
    for p in peers:
        addr = (p.get("connectionAddrs") or p.get("addrs") or [None])[0]
        relayed = None if p.get("relayed") is None else ("yes" if p["relayed"] else "no")
        rows.append(
            [
                p["peerId"],
                "yes" if p.get("connected") else "no",
                p.get("direction"),
                relayed,
                p.get("sandboxMode"),
                p.get("freeSlots"),
                _runtimes(p.get("runtimes")),
                addr,
            ]
        )
    return _table(["PEER", "CONNECTED", "DIRECTION", "RELAYED", "SANDBOX", "FREE SLOTS", "RUNTIMES", "ADDRESS"], rows)


def _runtimes(runtimes: Any) -> str | None:
    """Who offers which runtime: names, each with the head of its digest (docs/runtimes.md)."""
    if not isinstance(runtimes, list):
        return None
    return ",".join(f"{r.get('name')}@{str(r.get('digest', ''))[:8]}" for r in runtimes if isinstance(r, dict))


def format_jobs(status: dict[str, Any]) -> str:
    jobs = status.get("jobs", [])
    head = f"{status.get('queueDepth', 0)} offers waiting in the queue"
    if not jobs:
        return f"{head}; no job taken yet"
    rows = []
    for j in jobs:
        if j.get("state") not in ("answered", "cancelled"):
            outcome = None
        elif j.get("ok"):
            outcome = "ok"
        else:
            outcome = j.get("errorKind") or "failed"
        rows.append(
            [
                j["offerId"][:12],
                j.get("offerer"),
                j.get("transport"),
                j.get("state"),
                j.get("attempt", 1),
                outcome,
                j.get("queueReason"),
                j.get("durationMs"),
            ]
        )
    return (
        head
        + "\n"
        + _table(["OFFER", "OFFERER", "TRANSPORT", "STATE", "ATTEMPT", "RESULT", "QUEUE REASON", "RUN MS"], rows)
    )
