"""The coordinator pull transport: the node as an agent of a coordinator (`mesh/coordinator/`), pulling queued offers.

Like every transport it knows nothing of Docker: it knows only whether the node takes remote work
(`sink.participating`, the sandbox gate's view), which is exactly the sandbox mode it reports: `docker` while the
node participates, `none` otherwise. It always registers and heartbeats, reporting the mode honestly, and calls
`/pull` only while the sink participates, read just before each pull, so a withdrawn gate stops the pulling at
the next poll.

A pulled task is already claimed by `/pull`, so its `Delivery.claim` returns True without asking anyone. Its reply
POSTs the signed result to `/tasks/{id}/result`. If the sink refuses the offer, the refusal goes back to
`/tasks/{id}/release` with the node's reason, and the coordinator decides whether the task fails or is requeued
(see `mesh/coordinator/release.py`).
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
import trio

from transports.base import Delivery, OfferSink, Verdict
from transports.wire import agent_requests as signing
from transports.wire.identity import NodeIdentity
from transports.wire.jsontext import JsonError, parse_json
from transports.wire.reasons import Rejection

log = structlog.get_logger("edgecoder.transports.coordinator")

TRANSPORT_NAME = "coordinator"
JSON = "application/json"
OCTETS = "application/octet-stream"
# A result is worth keeping: it is retried through a coordinator's overload (429, 5xx) for about two minutes.
POST_ATTEMPTS = 8
# Statuses after which the same request may well succeed later: rate limited, overloaded, or failing for now.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ANSWER_BYTES = 1 << 20
DEFAULT_HEARTBEAT_S = 10.0
MIN_HEARTBEAT_S = 0.05
MAX_HEARTBEAT_S = 60.0


class CoordinatorRefused(Exception):
    """The coordinator answered with a typed refusal `{"reason", "detail"}`."""

    def __init__(self, status: int, reason: str, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES


def _retry_after(value: str | None, cap: float) -> float | None:
    """`Retry-After` in seconds (the HTTP-date form is not used by our coordinator and is ignored), capped."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return min(max(seconds, 0.0), cap) if seconds == seconds else None  # NaN is no advice


def _json_answer(response: httpx.Response, path: str) -> Any:
    return _json_content(response.content, path)


def _json_content(content: bytes, path: str) -> Any:
    try:
        return parse_json(content, max_bytes=MAX_ANSWER_BYTES)
    except JsonError as exc:
        raise ValueError(f"{path} answered with JSON we do not take: {exc}") from None


def parse_pull_answer(content: bytes) -> PulledTask | None:
    """A `/pull` answer's task, None when the queue had nothing, or `ValueError` for anything else."""
    answer = _json_content(content, "/pull")
    try:
        task = answer["task"]
        if task is None:
            return None
        return PulledTask(str(task["taskId"])[:64], base64.b64decode(task["offer"], validate=True))
    except (KeyError, TypeError, IndexError) as exc:  # ValueError (bad base64) passes through as it is
        raise ValueError(f"/pull answered with an unexpected shape: {type(exc).__name__}") from None


@dataclass(frozen=True, slots=True)
class PulledTask:
    task_id: str
    offer: bytes


class OneChunkBody(httpx.AsyncByteStream):
    """A request body of bytes, sent as one chunk by an iterator that is not an async generator.

    httpx wraps a `content=bytes` body in `ByteStream`, whose `__aiter__` is an async generator. When a request is
    cancelled while httpcore sends that chunk (the node shutting down mid-pull, or a timeout), the generator is left
    suspended at its `yield`, and trio reports it as garbage collected before it was exhausted (a ResourceWarning;
    httpx issue 3686). A plain iterator has nothing to finalise."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    def __aiter__(self) -> OneChunkBody:
        return self

    async def __anext__(self) -> bytes:
        if self._body is None:
            raise StopAsyncIteration
        body, self._body = self._body, None
        return body


async def _already_claimed() -> bool:
    """`/pull` claimed the task for this agent before handing it over."""
    return True


class CoordinatorPullTransport:
    name = TRANSPORT_NAME

    def __init__(
        self,
        url: str,
        identity: NodeIdentity,
        *,
        poll_interval: float = 1.0,
        heartbeat_interval: float | None = None,
        max_backoff: float = 30.0,
        request_timeout: float = 10.0,
        coordinator_key: bytes | None = None,
    ) -> None:
        """`heartbeat_interval` None uses the interval the coordinator asks for at registration.

        With `coordinator_key`, a /pull answer must carry that coordinator's signature (see `signing`) or it is
        ignored.
        """
        self.url = url.rstrip("/")
        self.identity = identity
        self.sink: OfferSink | None = None  # set by run()
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self.coordinator_key = coordinator_key
        self.registered = trio.Event()
        self._client: httpx.AsyncClient | None = None
        # Plain counters, for the node's status output and for tests.
        self.pull_requests = 0
        self.delivered = 0
        self.released = 0
        self.results_posted = 0
        # Answers that said "later" (429, 5xx), by what was asked: each was retried when the coordinator advised.
        self.deferred: Counter[str] = Counter()

    # -- running ---------------------------------------------------------------------------------------------

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat and pull until cancelled. Network trouble is logged and retried, never raised.

        Started at once: registration keeps retrying in the background while the coordinator is away."""
        self.sink = sink
        task_status.started()
        async with httpx.AsyncClient(base_url=self.url, timeout=self.request_timeout) as client:
            self._client = client
            try:
                heartbeat_s = await self._register_until_done()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._heartbeat_forever, self.heartbeat_interval or heartbeat_s)
                    nursery.start_soon(self._pull_forever)
            finally:
                self._client = None

    def may_pull(self) -> bool:
        return self.sink is not None and self.sink.participating

    def sandbox_mode(self) -> str:
        """What this agent reports: `docker` exactly while the node takes remote work."""
        return "docker" if self.may_pull() else "none"

    async def _register_until_done(self) -> float:
        backoff = self.poll_interval
        while True:
            try:
                answer = await self._call_json("/agents/register", {"sandboxMode": self.sandbox_mode()})
            except (httpx.HTTPError, CoordinatorRefused, ValueError) as exc:
                wait = self._wait_after(exc, backoff, "register")
                log.warning("coordinator_register_failed", url=self.url, error=str(exc), retry_in=wait)
                await trio.sleep(wait)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            self.registered.set()
            log.info("coordinator_registered", url=self.url, sandbox_mode=self.sandbox_mode())
            heartbeat_ms = answer.get("heartbeatMs")
            if type(heartbeat_ms) is not int or heartbeat_ms <= 0:
                return DEFAULT_HEARTBEAT_S
            # A coordinator's advice, within reason: a 1 ms interval would have us flood it, a huge one go silent.
            return min(max(heartbeat_ms / 1000, MIN_HEARTBEAT_S), MAX_HEARTBEAT_S)

    async def _heartbeat_forever(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            try:
                await self._call_json("/agents/heartbeat", {"sandboxMode": self.sandbox_mode()})
            except CoordinatorRefused as exc:
                if exc.reason == "unknown_agent":  # the coordinator lost its state: introduce ourselves again
                    await self._register_until_done()
                else:
                    log.warning("coordinator_heartbeat_refused", reason=exc.reason, detail=exc.detail)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("coordinator_heartbeat_failed", url=self.url, error=str(exc))

    async def _pull_forever(self) -> None:
        backoff = self.poll_interval
        while True:
            if not self.may_pull():
                await trio.sleep(self.poll_interval)
                continue
            try:
                task = await self._pull_once()
            except (httpx.HTTPError, CoordinatorRefused, ValueError) as exc:
                wait = self._wait_after(exc, backoff, "pull")
                log.warning("coordinator_pull_failed", url=self.url, error=str(exc), retry_in=wait)
                await trio.sleep(wait)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = self.poll_interval
            if task is None:
                await trio.sleep(self.poll_interval)
                continue
            verdict = await self._deliver(task)
            if isinstance(verdict, Rejection):
                await self._release(task, verdict)
                # A refusing node is often a busy one: give it a poll interval before it takes more.
                await trio.sleep(self.poll_interval)

    # -- one task --------------------------------------------------------------------------------------------

    async def _pull_once(self) -> PulledTask | None:
        """One `/pull`. None when the queue has nothing for this agent. Raises on refusal or network failure."""
        self.pull_requests += 1
        body = json.dumps({"sandboxMode": self.sandbox_mode()}).encode()
        response, nonce = await self._send("POST", "/pull", body, JSON)
        if self.coordinator_key is not None and not signing.response_signature_valid(
            self.coordinator_key, response.headers.get(signing.COORDINATOR_SIGNATURE), nonce, response.content
        ):
            # A wrong pin or someone in the middle: back off like any failure (each such answer holds a claim that
            # lingers until the task's deadline, so pulling fast would only strand more tasks).
            raise ValueError("the /pull answer is not signed by the pinned coordinator key")
        return parse_pull_answer(response.content)

    async def _deliver(self, task: PulledTask) -> Verdict:
        async def reply(raw: bytes) -> None:
            await self._post_result(task.task_id, raw)

        self.delivered += 1
        assert self.sink is not None  # pulling happens only while run() holds a sink
        return await self.sink.deliver(
            Delivery(raw=task.offer, transport=TRANSPORT_NAME, sender=self.url, reply=reply, claim=_already_claimed)
        )

    async def _release(self, task: PulledTask, rejection: Rejection) -> None:
        body = json.dumps(rejection.to_json()).encode()
        if await self._post_reliably(f"/tasks/{task.task_id}/release", body, JSON, task.task_id, "release"):
            self.released += 1

    async def _post_result(self, task_id: str, raw: bytes) -> None:
        """The delivery's reply: the signed result goes to the coordinator. Never raises into the node's worker."""
        if await self._post_reliably(f"/tasks/{task_id}/result", raw, OCTETS, task_id, "result"):
            self.results_posted += 1

    async def _post_reliably(self, path: str, body: bytes, content_type: str, task_id: str, what: str) -> bool:
        """Retries network failures and the refusals that say "later" (429, 5xx, honouring `Retry-After`), not the
        ones that will not change (the claim lapsed, say).

        Lost for good, a release leaves the task claimed by this live agent until its deadline, and a result leaves
        it to lapse and be run again elsewhere; both are logged as errors for that reason.
        """
        backoff = self.poll_interval
        for attempt in range(1, POST_ATTEMPTS + 1):
            if self._client is None:
                log.error("coordinator_post_dropped", what=what, task=task_id, why="the transport has stopped")
                return False
            try:
                await self._send("POST", path, body, content_type)
            except CoordinatorRefused as exc:
                if not exc.retryable:
                    log.warning(
                        "coordinator_post_refused", what=what, task=task_id, reason=exc.reason, detail=exc.detail
                    )
                    return False
                wait = self._wait_after(exc, backoff, what)
                log.warning("coordinator_post_deferred", what=what, task=task_id, status=exc.status, retry_in=wait)
                await trio.sleep(wait)
            except httpx.HTTPError as exc:
                log.warning("coordinator_post_failed", what=what, task=task_id, attempt=attempt, error=str(exc))
                await trio.sleep(backoff)
            else:
                return True
            backoff = min(backoff * 2, self.max_backoff)
        log.error("coordinator_post_lost", what=what, task=task_id, attempts=POST_ATTEMPTS)
        return False

    def _wait_after(self, exc: Exception, backoff: float, what: str) -> float:
        """How long to wait before asking again: our backoff, or longer when the coordinator said when."""
        if not isinstance(exc, CoordinatorRefused):
            return backoff
        if exc.retryable:
            self.deferred[what] += 1
        return backoff if exc.retry_after_s is None else max(backoff, exc.retry_after_s)

    # -- HTTP ------------------------------------------------------------------------------------------------

    async def _call_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        response, _ = await self._send("POST", path, json.dumps(payload).encode(), JSON)
        answer = _json_answer(response, path)
        if not isinstance(answer, dict):
            raise ValueError(f"{path} answered with JSON that is not an object")
        return answer

    async def _send(self, method: str, path: str, body: bytes, content_type: str) -> tuple[httpx.Response, bytes]:
        """A signed request; returns the 2xx response and the nonce it was signed with. Raises `CoordinatorRefused`."""
        if self._client is None:
            raise httpx.TransportError("the transport is not running")
        headers = signing.sign_request(self.identity, method, path, body)
        headers["content-type"] = content_type
        request = self._client.build_request(method, path, content=body, headers=headers)  # sets Content-Length
        request.stream = OneChunkBody(body)
        response = await self._client.send(request)
        if response.is_success:
            return response, bytes.fromhex(headers[signing.NONCE])
        try:
            refusal = _json_answer(response, path)
            reason, detail = str(refusal["reason"])[:64], str(refusal.get("detail", ""))[:500]
        except (ValueError, KeyError, TypeError, AttributeError):
            reason, detail = "http_error", response.text[:200]
        advised = _retry_after(response.headers.get("retry-after"), self.max_backoff)
        raise CoordinatorRefused(response.status_code, reason, detail, advised)
