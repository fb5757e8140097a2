"""The coordinator: a small HTTP service that queues signed task offers and hands them to agents that can sandbox.

Modules: `signing` (request signatures, shared with the node's pull transport), `errors` (refusal codes),
`store` (SQLite state), `ratelimit`, `release` (what a node's refusal does to a task), `app` (the HTTP API),
`server` (Hypercorn on trio), `cli` (the `coordinator` click command).
"""
