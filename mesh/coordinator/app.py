"""The coordinator's HTTP API (Starlette): agents register, heartbeat, pull tasks and post results back.

Every agent endpoint goes through `_authenticate`, in this order: body size, signature headers, clock, signature,
rate limit, nonce. The order is cheapest-first, and nothing keyed by the agent (its bucket, its nonces) is touched
before its signature has verified. See docs/coordinator.md for the endpoint list.

What fresh keys can make it hold (benchmarks/coordinator_growth.py measures it): request bodies in memory are bounded
in all (`max_body_bytes_in_flight`, reserved before a byte is read: 150 concurrent 250 KiB offers had peaked at
130 MB of Python heap); new agents and offers from offerers not yet established draw on node-wide budgets
(`new_agents_per_s`, `fresh_offers_per_s`) and fresh offerers together hold at most `fresh_share` of the queue; the
queued offers are capped in bytes, and a finished task keeps its result but not its offer. Past a budget the answer
is 503 `busy` with `Retry-After`. Reads are signed: `GET /tasks/{id}` answers only the task's own offerer, and
`/stats` holds counts only.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mesh.coordinator.release import disposition_of
from mesh.coordinator.store import Caps, ClaimedTask, Database, Store
from mesh.limits import RateLimiter
from mesh.peers import SANDBOX_MODES, SandboxMode
from transports.wire import agent_requests as signing
from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES
from transports.wire.coordinator_errors import CoordinatorReason, Refused
from transports.wire.identity import NodeIdentity
from transports.wire.jsontext import JsonError, parse_json
from transports.wire.offers import MAX_RESULT_BYTES, ClockPolicy, open_offer
from transports.wire.peerid import ed25519_peer_id
from transports.wire.reasons import Reason, Rejected, Rejection, wire_refusal
from transports.wire.results import open_result

log = structlog.get_logger("edgecoder.coordinator")

MAX_JSON_BODY = 4 * 1024
MAX_DETAIL_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class Settings:
    lease_ms: int = 30_000  # a claim lapses when its agent has sent nothing for this long
    heartbeat_ms: int = 10_000  # what agents are told to use; a third of the lease leaves two to spare
    rate_per_s: float = 5.0  # per agent (and per offerer on enqueue)
    burst: int = 20
    max_lapses: int = 3  # leases lost before the task fails instead of being requeued again
    # How long after an offer's expiry a claimed task may still report: its run may have started just in time.
    claim_grace_ms: int = 60_000
    # Bounded tables. Finished tasks (done, failed, expired) are kept `retention_ms` for `GET /tasks/{id}`, then
    # deleted; an agent silent for `agent_retention_ms` and holding no claim is forgotten (it registers again).
    retention_ms: int = 24 * 3600 * 1000
    agent_retention_ms: int = 7 * 24 * 3600 * 1000
    max_queued: int = 10_000  # queued or claimed tasks, in all
    max_queued_per_offerer: int = 1_000
    max_agents: int = 10_000
    # The clock skew allowed when checking offers (enqueue, and the re-check of a release that blames the offer).
    offer_skew_ms: int = 30_000
    # Fresh keys. An offerer is established once tasks of it were done here over `tenure_ms`, or when listed in
    # `trusted_offerers` (hex keys); its tasks are pulled first. Offerers not yet established hold at most
    # `fresh_share` of the unfinished tasks, and enqueue within one budget for all of them; agents not yet known
    # register within another.
    tenure_ms: int = 600_000
    trusted_offerers: frozenset[str] = frozenset()
    fresh_share: float = 0.5
    fresh_offers_per_s: float = 20.0
    fresh_offers_burst: int = 100
    new_agents_per_s: float = 2.0
    new_agents_burst: int = 20
    # Memory and disk: request bodies held at once, and the bytes of the queued offers.
    max_body_bytes_in_flight: int = 16 << 20
    max_queued_bytes: int = 256 << 20

    @property
    def offer_clock(self) -> ClockPolicy:
        return ClockPolicy(max_skew_ms=self.offer_skew_ms)

    @property
    def caps(self) -> Caps:
        return Caps(
            max_open=self.max_queued,
            max_open_per_offerer=self.max_queued_per_offerer,
            max_open_fresh=max(1, int(self.max_queued * self.fresh_share)),
            max_open_bytes=self.max_queued_bytes,
            tenure_ms=self.tenure_ms,
        )


class BodyBudget:
    """Bytes of request bodies held in memory at once, across every request: reserved before they are read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


def _peer(agent_hex: str) -> str:
    """An agent as people know it: the PeerID of the node whose key signs its requests (logs show this)."""
    return ed25519_peer_id(bytes.fromhex(agent_hex))


def _refused_response(exc: Refused) -> JSONResponse:
    response = JSONResponse(exc.to_json(), status_code=exc.status)
    if exc.retry_after_s is not None:
        response.headers["retry-after"] = str(exc.retry_after_s)
    return response


def _codec_refusal(exc: Rejected) -> Refused:
    """A payload (offer, result) refused by the codec keeps the codec's reason; it is not an HTTP auth failure."""
    status = 413 if exc.reason is Reason.TOO_LARGE else 422
    return Refused(str(exc.reason), exc.rejection.detail, status=status)


def _json_object(body: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    try:
        data = parse_json(body, max_depth=2) if body else {}
    except JsonError as exc:
        raise Refused(CoordinatorReason.MALFORMED, f"body is not a flat JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(CoordinatorReason.MALFORMED, "body is not a JSON object")
    unknown = set(data) - allowed
    if unknown:
        raise Refused(CoordinatorReason.MALFORMED, f"unknown field {sorted(unknown)[0]!r}")
    return data


def _sandbox_mode(data: dict[str, Any], *, required: bool) -> SandboxMode | None:
    mode = data.get("sandboxMode")
    if mode not in SANDBOX_MODES and (mode is not None or required):  # absent is fine where it is not required
        raise Refused(CoordinatorReason.MALFORMED, f"sandboxMode must be one of {list(SANDBOX_MODES)}")
    return mode


def _task_id(request: Request) -> str:
    task_id = request.path_params["task_id"]
    if len(task_id) != 32 or any(c not in "0123456789abcdef" for c in task_id):
        raise Refused(CoordinatorReason.MALFORMED, "a task id is 32 lowercase hex digits (the offer id)")
    return str(task_id)


class Coordinator:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        identity: NodeIdentity | None = None,
        clock: Callable[[], int] = signing.now_ms,
    ) -> None:
        self.db = db
        self.identity = identity
        self.settings = settings
        self.clock = clock
        self.agent_rates = RateLimiter(settings.rate_per_s, settings.burst)
        self.offerer_rates = RateLimiter(settings.rate_per_s, settings.burst)
        # Node-wide budgets, one bucket each: keys nobody knows yet share them.
        self.fresh_offers = RateLimiter(settings.fresh_offers_per_s, settings.fresh_offers_burst, max_keys=1)
        self.new_agents = RateLimiter(settings.new_agents_per_s, settings.new_agents_burst, max_keys=1)
        self.bodies = BodyBudget(settings.max_body_bytes_in_flight)

    def app(self) -> Starlette:
        bounded = self._bounded
        return Starlette(
            routes=[
                Route("/agents/register", bounded(self.register), methods=["POST"]),
                Route("/agents/heartbeat", bounded(self.heartbeat), methods=["POST"]),
                Route("/pull", bounded(self.pull), methods=["POST"]),
                Route("/tasks", bounded(self.enqueue), methods=["POST"]),
                Route("/tasks/{task_id}", bounded(self.task_status), methods=["GET"]),
                Route("/tasks/{task_id}/result", bounded(self.post_result), methods=["POST"]),
                Route("/tasks/{task_id}/release", bounded(self.release), methods=["POST"]),
                Route("/stats", self.stats, methods=["GET"]),
            ],
            exception_handlers={
                Refused: self._on_refused,
                HTTPException: self._on_http_error,
                Exception: self._on_crash,
            },
        )

    # -- plumbing --------------------------------------------------------------------------------------------

    async def _on_refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        log.info("refused", path=request.url.path, reason=exc.reason, detail=exc.detail)
        return _refused_response(exc)

    async def _on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        reason = CoordinatorReason.NOT_FOUND if exc.status_code in (404, 405) else CoordinatorReason.MALFORMED
        return _refused_response(Refused(reason, str(exc.detail), status=exc.status_code))

    async def _on_crash(self, request: Request, exc: Exception) -> Response:
        log.error("internal_error", path=request.url.path, error=repr(exc))
        return _refused_response(Refused(CoordinatorReason.INTERNAL, "the coordinator failed; see its log"))

    def _bounded(self, endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint, with whatever body budget its request reserved given back when it is done."""

        async def bounded(request: Request) -> Response:
            request.state.reserved = 0
            try:
                return await endpoint(request)
            finally:
                self.bodies.give(request.state.reserved)

        return bounded

    def _reserve(self, request: Request, n: int) -> bool:
        if not self.bodies.take(n):
            return False
        request.state.reserved += n
        return True

    async def _body(self, request: Request, cap: int) -> bytes:
        """The body, never more than `cap` bytes of it in memory, whatever Content-Length claims, and never more
        than the coordinator's budget for all bodies at once: the declared length is reserved before reading.

        A body refused for want of budget is still read, a chunk at a time and thrown away (memory stays flat),
        so that the client reads a clean 503 with `Retry-After` instead of a connection cut mid-upload."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise Refused(CoordinatorReason.TOO_LARGE, f"{declared} bytes > cap {cap}")
        holding = declared is None or not declared.isdigit() or self._reserve(request, int(declared))
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise Refused(CoordinatorReason.TOO_LARGE, f"more than cap {cap} bytes")
                if holding and size > request.state.reserved:  # no length declared (chunked), or more than it said
                    holding = self._reserve(request, size - request.state.reserved)
                if holding:
                    chunks.append(chunk)
                else:
                    chunks.clear()
        except ClientDisconnect:
            raise Refused(CoordinatorReason.MALFORMED, f"the client went away after {size} bytes") from None
        if not holding:
            raise Refused(
                CoordinatorReason.BUSY, "the coordinator holds as many request bodies as it may; retry", retry_after_s=1
            )
        return b"".join(chunks)

    async def _authenticate(self, request: Request, cap: int) -> tuple[str, bytes]:
        """(agent key as hex, body) of a signed, fresh, first-seen, within-rate request. Raises `Refused`.

        The verified nonce is kept on the request, for `_signed_json` to bind the answer to."""
        body = await self._body(request, cap)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        now = self.clock()
        verified = signing.verify_request(dict(request.headers), request.method, target, body, now=now)
        if not self.agent_rates.allow(verified.agent, trio.current_time()):
            raise Refused(
                CoordinatorReason.RATE_LIMITED, "too many requests from this agent; slow down", retry_after_s=1
            )
        agent = verified.agent.hex()
        if not await self.db.call(
            Store.use_nonce, self.db.store, agent, verified.nonce.hex(), now, signing.NONCE_TTL_MS
        ):
            raise Refused(CoordinatorReason.REPLAYED_NONCE, "this agent already sent a request with this nonce")
        request.state.nonce = verified.nonce
        return agent, body

    def _signed_json(self, request: Request, content: Any) -> Response:
        response = JSONResponse(content)
        if self.identity is not None:
            response.headers[signing.COORDINATOR_SIGNATURE] = signing.sign_response(
                self.identity, request.state.nonce, bytes(response.body)
            )
        return response

    async def _touch(self, agent: str, mode: SandboxMode | None = None) -> None:
        if not await self.db.call(Store.touch, self.db.store, agent, self.clock(), mode):
            raise Refused(CoordinatorReason.UNKNOWN_AGENT, "register first")

    # -- agents ----------------------------------------------------------------------------------------------

    async def register(self, request: Request) -> Response:
        agent, body = await self._authenticate(request, MAX_JSON_BODY)
        mode = _sandbox_mode(_json_object(body, frozenset({"sandboxMode"})), required=True)
        assert mode is not None
        known = await self.db.call(Store.agent_known, self.db.store, agent)
        if not known and not self.new_agents.allow("new", trio.current_time()):
            raise Refused(
                CoordinatorReason.BUSY,
                "new agents are registering faster than the coordinator takes them; retry",
                retry_after_s=max(1, math.ceil(1 / self.settings.new_agents_per_s)),
            )
        if not await self.db.call(Store.register, self.db.store, agent, mode, self.clock(), self.settings.max_agents):
            raise Refused(CoordinatorReason.BUSY, "the coordinator has as many agents as it holds", retry_after_s=60)
        log.info("agent_registered", agent=_peer(agent), sandbox_mode=mode)
        return JSONResponse(
            {"agent": agent, "leaseMs": self.settings.lease_ms, "heartbeatMs": self.settings.heartbeat_ms}
        )

    async def heartbeat(self, request: Request) -> Response:
        agent, body = await self._authenticate(request, MAX_JSON_BODY)
        mode = _sandbox_mode(_json_object(body, frozenset({"sandboxMode"})), required=True)
        await self._touch(agent, mode)
        return JSONResponse({"ok": True})

    async def pull(self, request: Request) -> Response:
        agent, body = await self._authenticate(request, MAX_JSON_BODY)
        mode = _sandbox_mode(_json_object(body, frozenset({"sandboxMode"})), required=False)
        outcome = await self.db.call(
            Store.pull, self.db.store, agent, mode, self.clock(), self.settings.lease_ms, self.settings.tenure_ms
        )
        if outcome == "unknown_agent":
            raise Refused(CoordinatorReason.UNKNOWN_AGENT, "register first")
        if outcome == "sandbox_unavailable":
            raise Refused(
                CoordinatorReason.SANDBOX_UNAVAILABLE,
                "this agent reports sandboxMode 'none'; remote tasks run only in Docker",
            )
        if outcome is None:
            return self._signed_json(request, {"task": None})
        assert isinstance(outcome, ClaimedTask)
        log.info("task_claimed", task=outcome.task_id, agent=_peer(agent))
        return self._signed_json(
            request,
            {
                "task": {
                    "taskId": outcome.task_id,
                    "offer": base64.b64encode(outcome.offer).decode(),
                    "leaseMs": self.settings.lease_ms,
                }
            },
        )

    # -- tasks -----------------------------------------------------------------------------------------------

    async def enqueue(self, request: Request) -> Response:
        """Submitters post a signed offer as the raw body. The offer's own signature is the authentication."""
        raw = await self._body(request, DEFAULT_MAX_MESSAGE_BYTES)
        try:
            received = open_offer(raw, clock=self.settings.offer_clock)
        except Rejected as exc:
            raise _codec_refusal(exc) from None
        offer = received.offer
        if not self.offerer_rates.allow(offer.offerer, trio.current_time()):
            raise Refused(
                CoordinatorReason.RATE_LIMITED, "too many offers from this offerer; slow down", retry_after_s=1
            )
        if offer.sandbox != "docker":
            raise Refused(str(Reason.SANDBOX_REQUIRED), "remote tasks run only in the sandbox; this asks for the host")
        offerer = offer.offerer.hex()
        now = self.clock()
        established = await self.db.call(Store.established, self.db.store, offerer, now, self.settings.tenure_ms)
        if not established and not self.fresh_offers.allow("fresh", trio.current_time()):
            raise Refused(
                CoordinatorReason.BUSY,
                "offers from offerers this coordinator has not served are arriving faster than it takes them; retry",
                retry_after_s=1,
            )
        task_id = offer.offer_id.hex()
        deadline = offer.expires_at_ms + offer.limits.timeout_ms + self.settings.claim_grace_ms
        outcome = await self.db.call(
            Store.enqueue,
            self.db.store,
            task_id,
            received.raw,
            received.digest,
            offerer,
            offer.expires_at_ms,
            deadline,
            now,
            self.settings.caps,
        )
        if outcome == "duplicate":
            raise Refused(CoordinatorReason.DUPLICATE_TASK, "an offer with this id was already enqueued")
        if outcome != "queued":
            who = {
                "offerer_full": "this offerer has as many unfinished tasks as it may hold",
                "fresh_full": "offerers this coordinator has not served hold as many unfinished tasks as they may",
                "bytes_full": "the queued offers take as many bytes as the coordinator holds",
            }.get(outcome, "the coordinator has as many unfinished tasks as it holds")
            raise Refused(CoordinatorReason.BUSY, who, retry_after_s=5)
        log.info("task_enqueued", task=task_id, offerer=ed25519_peer_id(offer.offerer))
        return JSONResponse({"taskId": task_id}, status_code=201)

    async def task_status(self, request: Request) -> Response:
        """A task's state and result, for its own offerer only: the request is signed with the offerer's key (the
        `x-edgecoder-agent` header carries it), and any other key is told there is no such task."""
        task_id = _task_id(request)
        reader, _ = await self._authenticate(request, 0)
        row = await self.db.call(Store.task, self.db.store, task_id)
        if row is None or row.offerer != reader:
            raise Refused(CoordinatorReason.UNKNOWN_TASK, "no such task of yours")
        return JSONResponse(
            {
                "taskId": row.task_id,
                "state": row.state,
                "claimedBy": row.claimed_by,
                # The same agent as people know it (a node's PeerID), beside the key its requests are signed with.
                "claimedByPeerId": None if row.claimed_by is None else ed25519_peer_id(bytes.fromhex(row.claimed_by)),
                "claims": row.claims,
                "reason": row.reason,
                "detail": row.detail,
                "result": None if row.result is None else base64.b64encode(row.result).decode(),
            }
        )

    async def _claimed_by(self, task_id: str, agent: str) -> bytes:
        """The offer digest of a task this agent holds the claim on; otherwise the refusal that says why not."""
        row = await self.db.call(Store.task, self.db.store, task_id)
        if row is None:
            raise Refused(CoordinatorReason.UNKNOWN_TASK, "no such task")
        if row.state != "claimed":
            raise Refused(CoordinatorReason.NOT_CLAIMED, f"task is {row.state}, not claimed")
        if row.claimed_by != agent:
            raise Refused(CoordinatorReason.CLAIMED_BY_OTHER, "another agent holds the claim on this task")
        return row.offer_digest

    async def post_result(self, request: Request) -> Response:
        task_id = _task_id(request)
        agent, raw = await self._authenticate(request, MAX_RESULT_BYTES)
        await self._touch(agent)
        offer_digest = await self._claimed_by(task_id, agent)
        try:
            result = open_result(raw, expect_executor=bytes.fromhex(agent))
        except Rejected as exc:
            raise _codec_refusal(exc) from None
        if result.offer_id.hex() != task_id or result.offer_digest != offer_digest:
            raise Refused(CoordinatorReason.RESULT_MISMATCH, "the result names another offer")
        if not await self.db.call(Store.complete, self.db.store, task_id, agent, raw, self.clock()):
            # The lease lapsed between the check and now: someone else may be running it.
            raise Refused(CoordinatorReason.NOT_CLAIMED, "the claim lapsed before the result arrived")
        log.info("task_done", task=task_id, agent=_peer(agent), ok=result.result.ok)
        return JSONResponse({"taskId": task_id, "state": "done", "resultSha256": hashlib.sha256(raw).hexdigest()})

    async def release(self, request: Request) -> Response:
        """The claimant's node refused the offer; `release.disposition_of` decides what becomes of the task."""
        task_id = _task_id(request)
        agent, body = await self._authenticate(request, MAX_JSON_BODY)
        data = _json_object(body, frozenset({"reason", "detail"}))
        reason = wire_refusal(data.get("reason"))
        if reason is None:
            raise Refused(CoordinatorReason.MALFORMED, "reason must be one of the node's refusal codes")
        detail = data.get("detail", "")
        if not isinstance(detail, str) or len(detail) > MAX_DETAIL_CHARS:
            raise Refused(CoordinatorReason.MALFORMED, f"detail must be a string of at most {MAX_DETAIL_CHARS} chars")
        await self._touch(agent)
        await self._claimed_by(task_id, agent)
        disposition = disposition_of(reason)
        if disposition == "failed":
            # The agent blames the offer itself. Any agent can say so, so the coordinator checks the offer again
            # before failing the task for everyone: an agent's word alone only keeps the task from that agent.
            verdict = await self._recheck(task_id)
            if verdict is None:
                disposition = "requeue_elsewhere"
            else:
                reason, detail = verdict.reason, f"confirmed by the coordinator: {verdict.detail}"
        if not await self.db.call(
            Store.release, self.db.store, task_id, agent, disposition, str(reason), detail, self.clock()
        ):
            raise Refused(CoordinatorReason.NOT_CLAIMED, "the claim lapsed before the release arrived")
        log.info("task_released", task=task_id, agent=_peer(agent), reason=str(reason), disposition=disposition)
        return JSONResponse({"taskId": task_id, "disposition": disposition})

    async def _recheck(self, task_id: str) -> Rejection | None:
        """The coordinator's own verdict on a stored offer now: None when it is a good offer."""
        offer = await self.db.call(Store.offer_of, self.db.store, task_id)
        if offer is None:
            return Rejection(Reason.MALFORMED, "the offer is gone")
        try:
            received = open_offer(offer, clock=self.settings.offer_clock)
        except Rejected as exc:
            return exc.rejection
        if received.offer.sandbox != "docker":
            return Rejection(Reason.SANDBOX_REQUIRED, "the offer asks for the host")
        return None

    async def stats(self, request: Request) -> Response:
        """Aggregate counts only, of bounded size: nothing here identifies an agent or an offerer."""
        return JSONResponse(await self.db.call(Store.stats, self.db.store))
