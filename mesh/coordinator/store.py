"""The coordinator's durable state in one SQLite file: agents, tasks, refusals and request nonces.

Every method is a short synchronous transaction. `Database` runs them one at a time on a worker thread
(`trio.to_thread.run_sync` behind a limiter of one), so the event loop never blocks on disk and the single
connection is never used by two threads at once. WAL mode lets a reader (a test, an operator's `sqlite3`) look at
the file while the coordinator writes it.

Times are wall-clock milliseconds: they are stored, and must mean the same thing after a restart.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

from mesh.peers import SANDBOX_MODES, SandboxMode

TASK_STATES = ("queued", "claimed", "done", "failed", "expired")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent          TEXT PRIMARY KEY,            -- hex Ed25519 public key
    sandbox_mode   TEXT NOT NULL,               -- as last reported: 'docker' or 'none'
    registered_at  INTEGER NOT NULL,
    last_seen      INTEGER NOT NULL,            -- any authenticated request; the lease runs from here
    pull_requests  INTEGER NOT NULL DEFAULT 0,  -- every authenticated /pull, refused or not
    refused_pulls  INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tasks (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,  -- queue order
    task_id        TEXT NOT NULL UNIQUE,        -- hex offer id
    offer          BLOB NOT NULL,               -- the signed offer, exactly as submitted
    offer_digest   BLOB NOT NULL,               -- sha256(offer): a result must name it
    offerer        TEXT NOT NULL,
    expires_at     INTEGER NOT NULL,            -- the offer's own expiry: never handed out after it
    deadline       INTEGER NOT NULL,            -- a claimed task still unfinished by then has expired
    state          TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'done', 'failed', 'expired')),
    claimed_by     TEXT,
    claimed_at     INTEGER,
    claims         INTEGER NOT NULL DEFAULT 0,
    lapses         INTEGER NOT NULL DEFAULT 0,  -- leases lost to a silent agent
    result         BLOB,                        -- the signed result, exactly as posted
    reason         TEXT,
    detail         TEXT,
    enqueued_at    INTEGER NOT NULL,
    ready_at       INTEGER NOT NULL DEFAULT 0,  -- queue order: enqueued, or requeued (then it goes to the back)
    updated_at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, ready_at, seq);
CREATE INDEX IF NOT EXISTS tasks_by_offerer ON tasks (offerer, state);
-- An agent whose own policy refused a task is not handed it again; other agents still are.
CREATE TABLE IF NOT EXISTS refusals (
    task_id  TEXT NOT NULL,
    agent    TEXT NOT NULL,
    reason   TEXT NOT NULL,
    PRIMARY KEY (task_id, agent)
);
-- What the coordinator knows of each offerer: whether the operator trusts it, when tasks of it were first and last
-- done here (an offerer served over `tenure_ms` is established), and when one was last claimed (turns in /pull).
CREATE TABLE IF NOT EXISTS offerers (
    offerer          TEXT PRIMARY KEY,
    trusted          INTEGER NOT NULL DEFAULT 0,
    first_done_at    INTEGER,
    last_done_at     INTEGER,
    last_claimed_at  INTEGER NOT NULL DEFAULT 0,
    seen_at          INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS nonces (
    agent       TEXT NOT NULL,
    nonce       TEXT NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (agent, nonce)
);
CREATE INDEX IF NOT EXISTS nonces_by_expiry ON nonces (expires_at);
"""


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    task_id: str
    offer: bytes


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: str
    state: str
    claimed_by: str | None
    offer_digest: bytes
    result: bytes | None
    reason: str | None
    detail: str | None
    claims: int
    lapses: int
    offerer: str = ""


PullOutcome = Literal["unknown_agent", "sandbox_unavailable"] | ClaimedTask | None
EnqueueOutcome = Literal["queued", "duplicate", "full", "offerer_full", "fresh_full", "bytes_full"]
OPEN_STATES = "state IN ('queued', 'claimed')"


@dataclass(frozen=True, slots=True)
class Caps:
    """What the unfinished tasks may hold, in all, per offerer, for offerers not yet established, and in bytes."""

    max_open: int = 1 << 62
    max_open_per_offerer: int = 1 << 62
    max_open_fresh: int = 1 << 62
    max_open_bytes: int = 1 << 62
    tenure_ms: int = 0  # an offerer with tasks done here over this long is established


def _established(o: str, now: str, tenure: str) -> str:
    """SQL: the `offerers` row `o` is established at `now` (the operator trusts it, or it was served over tenure)."""
    return (
        f"(coalesce({o}.trusted, 0) = 1 OR ({o}.first_done_at IS NOT NULL AND {o}.first_done_at <= {now} - {tenure} "
        f"AND {o}.last_done_at >= {o}.first_done_at + {tenure}))"
    )


class Store:
    """Synchronous and not thread-safe by itself: use it through `Database`, or from one thread."""

    def __init__(self, path: Path | str, *, max_lapses: int = 3) -> None:
        self.max_lapses = max_lapses
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a transaction takes the write lock up front
        # and two transactions can never interleave their read-then-write.
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "PRAGMA synchronous=NORMAL"
        )  # WAL + NORMAL survives a process kill; a power cut may lose the last commits
        # The WAL is truncated back to this after a checkpoint: a burst of large offers must not leave it huge.
        self._db.execute(f"PRAGMA journal_size_limit={8 << 20}")
        self._migrate()
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        """Bring a state file of an earlier version up to this schema (columns added since, with their defaults)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(tasks)")}
        if columns and "ready_at" not in columns:
            self._db.execute("DROP INDEX IF EXISTS tasks_by_state")
            self._db.execute("ALTER TABLE tasks ADD COLUMN ready_at INTEGER NOT NULL DEFAULT 0")
            self._db.execute("UPDATE tasks SET ready_at = enqueued_at")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- agents ----------------------------------------------------------------------------------------------

    def register(self, agent: str, mode: SandboxMode, now: int, max_agents: int = 1 << 62) -> bool:
        """False when the table is full and this agent is new: the coordinator refuses rather than grow."""
        with self._transaction() as db:
            known = db.execute("SELECT 1 FROM agents WHERE agent = ?", (agent,)).fetchone() is not None
            if not known and db.execute("SELECT count(*) FROM agents").fetchone()[0] >= max_agents:
                return False
            db.execute(
                "INSERT INTO agents (agent, sandbox_mode, registered_at, last_seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (agent) DO UPDATE SET "
                "sandbox_mode = excluded.sandbox_mode, last_seen = excluded.last_seen",
                (agent, mode, now, now),
            )
            return True

    def touch(self, agent: str, now: int, mode: SandboxMode | None = None) -> bool:
        """A sign of life (and, for a heartbeat, the sandbox mode). False for an agent that never registered."""
        with self._transaction() as db:
            cur = db.execute(
                "UPDATE agents SET last_seen = ?, sandbox_mode = coalesce(?, sandbox_mode) WHERE agent = ?",
                (now, mode, agent),
            )
            return cur.rowcount == 1

    def use_nonce(self, agent: str, nonce: str, now: int, ttl_ms: int) -> bool:
        """Records the nonce; False if this agent already used it within its lifetime."""
        with self._transaction() as db:
            db.execute("DELETE FROM nonces WHERE expires_at < ?", (now,))
            cur = db.execute(
                "INSERT OR IGNORE INTO nonces (agent, nonce, expires_at) VALUES (?, ?, ?)", (agent, nonce, now + ttl_ms)
            )
            return cur.rowcount == 1

    # -- tasks -----------------------------------------------------------------------------------------------

    def trust(self, offerers: frozenset[str]) -> None:
        """The operator's list of trusted offerers (hex keys), replacing the previous one."""
        with self._transaction() as db:
            db.execute("UPDATE offerers SET trusted = 0")
            db.executemany(
                "INSERT INTO offerers (offerer, trusted) VALUES (?, 1) ON CONFLICT (offerer) DO UPDATE SET trusted = 1",
                [(o,) for o in sorted(offerers)],
            )

    def enqueue(
        self,
        task_id: str,
        offer: bytes,
        digest: bytes,
        offerer: str,
        expires_at: int,
        deadline: int,
        now: int,
        caps: Caps = Caps(),
    ) -> EnqueueOutcome:
        """`duplicate` if a task with this offer id is still known (an offer runs at most once); `full`,
        `offerer_full`, `fresh_full` or `bytes_full` when the unfinished tasks are at a cap; else `queued`."""
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is not None:
                return "duplicate"
            count, size = db.execute(
                f"SELECT count(*), coalesce(sum(length(offer)), 0) FROM tasks WHERE {OPEN_STATES}"
            ).fetchone()
            if count >= caps.max_open:
                return "full"
            if size + len(offer) > caps.max_open_bytes:
                return "bytes_full"
            by_offerer = f"SELECT count(*) FROM tasks WHERE {OPEN_STATES} AND offerer = ?"
            if db.execute(by_offerer, (offerer,)).fetchone()[0] >= caps.max_open_per_offerer:
                return "offerer_full"
            row = db.execute(
                f"SELECT {_established('o', '?', '?')} FROM offerers o WHERE o.offerer = ?",
                (now, caps.tenure_ms, caps.tenure_ms, offerer),
            ).fetchone()
            if not (row is not None and row[0]):
                fresh = db.execute(
                    f"SELECT count(*) FROM tasks t LEFT JOIN offerers o ON o.offerer = t.offerer WHERE "
                    f"t.{OPEN_STATES} AND NOT {_established('o', '?', '?')}",
                    (now, caps.tenure_ms, caps.tenure_ms),
                ).fetchone()[0]
                if fresh >= caps.max_open_fresh:
                    return "fresh_full"
            db.execute(
                "INSERT OR IGNORE INTO tasks (task_id, offer, offer_digest, offerer, expires_at, deadline, state, "
                "enqueued_at, updated_at, ready_at) VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                (task_id, offer, digest, offerer, expires_at, deadline, now, now, now),
            )
            db.execute(
                "INSERT INTO offerers (offerer, seen_at) VALUES (?, ?) "
                "ON CONFLICT (offerer) DO UPDATE SET seen_at = excluded.seen_at",
                (offerer, now),
            )
            return "queued"

    def pull(self, agent: str, mode: SandboxMode | None, now: int, lease_ms: int, tenure_ms: int = 0) -> PullOutcome:
        """Claim a task this agent may run, in one transaction: established offerers' tasks first, then offerers in
        turn (the one whose task was claimed longest ago), then the oldest task of that offerer. A swarm of fresh
        offerer keys with thousands of tasks queued is served after established offerers, and shares its turns.

        The sandbox check comes before any task is touched: an agent that cannot sandbox claims nothing, so nothing
        has to be requeued behind it.
        """
        with self._transaction() as db:
            row = db.execute("SELECT sandbox_mode FROM agents WHERE agent = ?", (agent,)).fetchone()
            if row is None:
                return "unknown_agent"
            effective = mode or row[0]
            refused = effective != "docker"
            db.execute(
                "UPDATE agents SET last_seen = ?, sandbox_mode = ?, pull_requests = pull_requests + 1, "
                "refused_pulls = refused_pulls + ? WHERE agent = ?",
                (now, effective, int(refused), agent),
            )
            if refused:
                return "sandbox_unavailable"
            self._reap(db, now, lease_ms)
            found = db.execute(
                f"SELECT t.task_id, t.offer, t.offerer FROM tasks t LEFT JOIN offerers o ON o.offerer = t.offerer "
                f"WHERE t.state = 'queued' AND t.expires_at > ? AND t.task_id NOT IN "
                f"(SELECT task_id FROM refusals WHERE agent = ?) "
                f"ORDER BY {_established('o', '?', '?')} DESC, coalesce(o.last_claimed_at, 0), t.ready_at, t.seq "
                f"LIMIT 1",
                (now, agent, now, tenure_ms, tenure_ms),
            ).fetchone()
            if found is None:
                return None
            db.execute(
                "UPDATE tasks SET state = 'claimed', claimed_by = ?, claimed_at = ?, claims = claims + 1, "
                "updated_at = ? WHERE task_id = ?",
                (agent, now, now, found[0]),
            )
            db.execute(
                "INSERT INTO offerers (offerer, last_claimed_at, seen_at) VALUES (?, ?, ?) ON CONFLICT (offerer) "
                "DO UPDATE SET last_claimed_at = excluded.last_claimed_at, seen_at = excluded.seen_at",
                (found[2], now, now),
            )
            return ClaimedTask(found[0], bytes(found[1]))

    def task(self, task_id: str) -> TaskRow | None:
        row = self._db.execute(
            "SELECT task_id, state, claimed_by, offer_digest, result, reason, detail, claims, lapses, offerer "
            "FROM tasks WHERE task_id = ?",
            (task_id,),
        ).fetchone()
        if row is None:
            return None
        return TaskRow(row[0], row[1], row[2], bytes(row[3]), None if row[4] is None else bytes(row[4]), *row[5:])

    def complete(self, task_id: str, agent: str, result: bytes, now: int) -> bool:
        """Store the verified result, if the agent still holds the claim (its lease may have lapsed meanwhile)."""
        with self._transaction() as db:
            # A finished task keeps its digest and result, not its offer: nothing reads the offer again.
            cur = db.execute(
                "UPDATE tasks SET state = 'done', result = ?, offer = x'', updated_at = ? "
                "WHERE task_id = ? AND state = 'claimed' AND claimed_by = ? RETURNING offerer",
                (result, now, task_id, agent),
            )
            row = cur.fetchone()
            if row is None:
                return False
            db.execute(
                "INSERT INTO offerers (offerer, first_done_at, last_done_at, seen_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (offerer) DO UPDATE SET first_done_at = coalesce(first_done_at, excluded.first_done_at), "
                "last_done_at = excluded.last_done_at, seen_at = excluded.seen_at",
                (row[0], now, now, now),
            )
            return True

    def release(self, task_id: str, agent: str, disposition: str, reason: str, detail: str, now: int) -> bool:
        """The claimant's node refused the offer. `disposition` is 'failed', 'requeue' or 'requeue_elsewhere'."""
        with self._transaction() as db:
            held = db.execute(
                "SELECT 1 FROM tasks WHERE task_id = ? AND state = 'claimed' AND claimed_by = ?", (task_id, agent)
            ).fetchone()
            if held is None:
                return False
            if disposition == "failed":
                db.execute(
                    "UPDATE tasks SET state = 'failed', offer = x'', reason = ?, detail = ?, updated_at = ? "
                    "WHERE task_id = ?",
                    (reason, detail, now, task_id),
                )
                return True
            if disposition == "requeue_elsewhere":
                db.execute(
                    "INSERT OR REPLACE INTO refusals (task_id, agent, reason) VALUES (?, ?, ?)",
                    (task_id, agent, reason),
                )
            # To the back of the queue: a task the agent could not take now must not come straight back to it and
            # hold up every task behind it.
            db.execute(
                "UPDATE tasks SET state = 'queued', claimed_by = NULL, claimed_at = NULL, reason = ?, detail = ?, "
                "updated_at = ?, ready_at = ? WHERE task_id = ?",
                (reason, detail, now, now, task_id),
            )
            return True

    def offer_of(self, task_id: str) -> bytes | None:
        row = self._db.execute("SELECT offer FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def purge(self, now: int, retention_ms: int, agent_retention_ms: int, skew_ms: int) -> int:
        """Delete finished tasks past their retention and agents long silent with no claim. Returns tasks deleted.

        A finished task is kept at least until its offer can no longer pass the clock check (`expires_at` plus
        the skew), so that deleting it never lets the same offer be enqueued again.
        """
        with self._transaction() as db:
            cur = db.execute(
                "DELETE FROM tasks WHERE state IN ('done', 'failed', 'expired') AND updated_at < ? AND expires_at < ?",
                (now - retention_ms, now - skew_ms),
            )
            db.execute("DELETE FROM refusals WHERE task_id NOT IN (SELECT task_id FROM tasks)")
            # An offerer is remembered while it has tasks, is trusted, or was active within the agents' retention.
            db.execute(
                "DELETE FROM offerers WHERE trusted = 0 AND max(seen_at, coalesce(last_done_at, 0)) < ? "
                "AND offerer NOT IN (SELECT offerer FROM tasks)",
                (now - agent_retention_ms,),
            )
            db.execute(
                "DELETE FROM agents WHERE last_seen < ? AND agent NOT IN "
                "(SELECT claimed_by FROM tasks WHERE state = 'claimed' AND claimed_by IS NOT NULL)",
                (now - agent_retention_ms,),
            )
            db.execute("DELETE FROM nonces WHERE expires_at < ?", (now,))
            return cur.rowcount

    def reap(self, now: int, lease_ms: int) -> None:
        with self._transaction() as db:
            self._reap(db, now, lease_ms)

    def _reap(self, db: sqlite3.Connection, now: int, lease_ms: int) -> None:
        """Expire what is past its time, and take claims back from agents silent for longer than a lease."""
        db.execute(
            "UPDATE tasks SET state = 'expired', offer = x'', reason = 'expired', updated_at = ? WHERE state = "
            "'queued' AND expires_at <= ?",
            (now, now),
        )
        db.execute(
            "UPDATE tasks SET state = 'expired', offer = x'', reason = 'expired', updated_at = ? WHERE state = "
            "'claimed' AND deadline <= ?",
            (now, now),
        )
        silent = "SELECT agent FROM agents WHERE last_seen < ?"
        db.execute(
            f"UPDATE tasks SET lapses = lapses + 1, updated_at = ?, ready_at = ?, state = CASE WHEN lapses + 1 >= ? "
            f"THEN 'failed' ELSE 'queued' END, offer = CASE WHEN lapses + 1 >= ? THEN x'' ELSE offer END, "
            f"reason = 'lease_expired', detail = 'claiming agent went silent', "
            f"claimed_by = NULL, claimed_at = NULL WHERE state = 'claimed' AND claimed_by IN ({silent})",
            (now, now, self.max_lapses, self.max_lapses, now - lease_ms),
        )

    # -- reading ---------------------------------------------------------------------------------------------

    def established(self, offerer: str, now: int, tenure_ms: int) -> bool:
        row = self._db.execute(
            f"SELECT {_established('o', '?', '?')} FROM offerers o WHERE o.offerer = ?",
            (now, tenure_ms, tenure_ms, offerer),
        ).fetchone()
        return row is not None and bool(row[0])

    def agent_known(self, agent: str) -> bool:
        return self._db.execute("SELECT 1 FROM agents WHERE agent = ?", (agent,)).fetchone() is not None

    def stats(self) -> dict[str, Any]:
        """Counts only: bounded in size whatever the tables hold, and nothing in it identifies anyone."""
        counts = dict.fromkeys(TASK_STATES, 0)
        counts.update(self._db.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        modes = dict.fromkeys(SANDBOX_MODES, 0)
        modes.update(self._db.execute("SELECT sandbox_mode, count(*) FROM agents GROUP BY sandbox_mode").fetchall())
        pulls, refused = self._db.execute(
            "SELECT coalesce(sum(pull_requests), 0), coalesce(sum(refused_pulls), 0) FROM agents"
        ).fetchone()
        return {
            "tasks": counts,
            "agents": {"bySandboxMode": modes, "pullRequests": pulls, "refusedPulls": refused},
        }


T = TypeVar("T")


class Database:
    """The async face of `Store`: each call runs on a worker thread, one at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiter = trio.CapacityLimiter(1)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        # Not abandoned on cancel: a transaction that started is allowed to finish, so state is never half-written.
        return await trio.to_thread.run_sync(partial(fn, *args), limiter=self._limiter)
