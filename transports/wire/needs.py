"""What an offer needs of the node that runs it (offer version 3), and what a node advertises it has.

An offer names a runtime (`runtime`: one of the names nodes declare, executor/runtimes.py), optionally pinned to
an exact package set (`runtimeDigest`: the SHA-256 of its sorted `package=version` list), and minimum resources
(`minResources`: cores, memory in MiB, an architecture, a GPU). It never names an image, a mount or a package:
those are the operator's (docs/runtimes.md). A node advertises `Capabilities` on its heartbeats and status: the
runtimes it has built, with their digests, and its resources; `unmet` is the one judgement of the two, used by the
intake (before any claim), the offerer judging a claim, and the choice of invitees.

These fields are on the wire only when set, so that a v3 offer that needs nothing keeps the bytes it had before
they existed; an explicit null is malformed (one encoding per meaning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from transports.wire.codec import Fields
from transports.wire.reasons import Reason, Rejected

DEFAULT_RUNTIME = "python"
MAX_RUNTIME_CHARS = 32
RUNTIME_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
DIGEST_HEX = re.compile(r"[0-9a-f]{64}")
MAX_ARCH_CHARS = 16
MAX_GPU_CHARS = 64
NEED_FIELDS = frozenset({"runtime", "runtimeDigest", "minResources"})
_RESOURCE_FIELDS = frozenset({"cores", "memoryMb", "arch", "gpu"})


@dataclass(frozen=True, slots=True)
class Resources:
    """Minimum resources an offer needs; None (or False) is no requirement."""

    cores: int | None = None
    memory_mb: int | None = None
    arch: str | None = None  # as `uname -m` says it: x86_64, aarch64
    gpu: bool = False

    @property
    def empty(self) -> bool:
        return self == Resources()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cores is not None:
            out["cores"] = self.cores
        if self.memory_mb is not None:
            out["memoryMb"] = self.memory_mb
        if self.arch is not None:
            out["arch"] = self.arch
        if self.gpu:
            out["gpu"] = True
        return out

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Resources:
        f = Fields(value, _RESOURCE_FIELDS, "offer.minResources")
        if not value:
            raise Rejected(Reason.MALFORMED, "offer.minResources is empty: leave it out")
        gpu = f.boolean("gpu") if "gpu" in value else False
        if "gpu" in value and not gpu:
            raise Rejected(Reason.MALFORMED, "offer.minResources.gpu is true or absent")
        return cls(
            cores=f.integer("cores", 1, 1024) if "cores" in value else None,
            memory_mb=f.integer("memoryMb", 1, 1 << 24) if "memoryMb" in value else None,
            arch=f.text("arch", MAX_ARCH_CHARS) if "arch" in value else None,
            gpu=gpu,
        )


@dataclass(frozen=True, slots=True)
class Needs:
    """An offer's v3 requirements. `runtime` None is the default runtime (`python`), on every node."""

    runtime: str | None = None
    runtime_digest: str | None = None
    resources: Resources = Resources()

    def __post_init__(self) -> None:
        if self.runtime is not None and not RUNTIME_NAME.fullmatch(self.runtime):
            raise ValueError(f"runtime {self.runtime[:40]!r}: lower case letters, digits and '-', at most 32")
        if self.runtime_digest is not None and not DIGEST_HEX.fullmatch(self.runtime_digest):
            raise ValueError("runtimeDigest is 64 lower-case hex digits (SHA-256)")

    @property
    def runtime_name(self) -> str:
        return self.runtime or DEFAULT_RUNTIME

    @property
    def empty(self) -> bool:
        return self == Needs()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.runtime is not None:
            out["runtime"] = self.runtime
        if self.runtime_digest is not None:
            out["runtimeDigest"] = self.runtime_digest
        if not self.resources.empty:
            out["minResources"] = self.resources.to_wire()
        return out

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> Needs:
        """Read from an offer's (already shape-checked) top-level fields."""
        f = Fields({k: v for k, v in fields.items() if k in NEED_FIELDS}, NEED_FIELDS, "offer")
        runtime = f.text("runtime", MAX_RUNTIME_CHARS) if "runtime" in fields else None
        if runtime is not None and not RUNTIME_NAME.fullmatch(runtime):
            raise Rejected(Reason.MALFORMED, f"offer: 'runtime' {runtime!r} is not a runtime name")
        digest = f.text("runtimeDigest", 64) if "runtimeDigest" in fields else None
        if digest is not None and not DIGEST_HEX.fullmatch(digest):
            raise Rejected(Reason.MALFORMED, "offer: 'runtimeDigest' must be 64 lower-case hex digits")
        resources = Resources.from_wire(f.map("minResources")) if "minResources" in fields else Resources()
        return cls(runtime, digest, resources)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a node advertises: its built runtimes (name -> digest) and its resources."""

    runtimes: dict[str, str]
    cores: int
    memory_mb: int
    arch: str
    gpu: str = "none"  # a model name where there is one

    def unmet(self, needs: Needs) -> tuple[Reason, str] | None:
        """Why this node cannot run an offer with `needs`, or None when it can."""
        name = needs.runtime_name
        have = self.runtimes.get(name)
        if have is None:
            offered = ", ".join(sorted(self.runtimes)) or "none"
            return Reason.RUNTIME_UNAVAILABLE, f"runtime {name!r} is not built here (offered: {offered})"
        if needs.runtime_digest is not None and needs.runtime_digest != have:
            return (
                Reason.RUNTIME_UNAVAILABLE,
                f"runtime {name!r} here is {have[:16]}..., the offer pins {needs.runtime_digest[:16]}...",
            )
        r = needs.resources
        if r.cores is not None and self.cores < r.cores:
            return Reason.RESOURCES_INSUFFICIENT, f"the offer needs {r.cores} cores; this node has {self.cores}"
        if r.memory_mb is not None and self.memory_mb < r.memory_mb:
            return Reason.RESOURCES_INSUFFICIENT, f"the offer needs {r.memory_mb} MiB; this node has {self.memory_mb}"
        if r.arch is not None and r.arch != self.arch:
            return Reason.RESOURCES_INSUFFICIENT, f"the offer needs {r.arch[:16]}; this node is {self.arch}"
        if r.gpu and self.gpu == "none":
            return Reason.RESOURCES_INSUFFICIENT, "the offer needs a GPU; this node has none"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "runtimes": [{"name": n, "digest": d} for n, d in sorted(self.runtimes.items())],
            "resources": {"cores": self.cores, "memoryMb": self.memory_mb, "arch": self.arch, "gpu": self.gpu},
        }

    @classmethod
    def from_json(cls, data: Any) -> Capabilities | None:
        """A neighbour's advertisement (heartbeat, status), or None when it is not one (an older node's)."""
        if not isinstance(data, dict):
            return None
        runtimes, resources = data.get("runtimes"), data.get("resources")
        if not isinstance(runtimes, list) or not isinstance(resources, dict) or len(runtimes) > 16:
            return None
        named: dict[str, str] = {}
        for entry in runtimes:
            if not isinstance(entry, dict):
                return None
            name, digest = entry.get("name"), entry.get("digest")
            if not isinstance(name, str) or not RUNTIME_NAME.fullmatch(name):
                return None
            if not isinstance(digest, str) or not DIGEST_HEX.fullmatch(digest):
                return None
            named[name] = digest
        cores, memory, arch, gpu = (resources.get(k) for k in ("cores", "memoryMb", "arch", "gpu"))
        if type(cores) is not int or type(memory) is not int or not isinstance(arch, str) or not isinstance(gpu, str):
            return None
        return cls(named, cores, memory, arch[:MAX_ARCH_CHARS], gpu[:MAX_GPU_CHARS])


def unmet_by(capabilities: Capabilities | None, needs: Needs) -> tuple[Reason, str] | None:
    """`capabilities.unmet(needs)`; a node that advertises none (one from before runtimes) runs only what needs
    nothing but the `python` runtime, whatever its package set."""
    if capabilities is not None:
        return capabilities.unmet(needs)
    if needs.runtime_name != DEFAULT_RUNTIME or needs.runtime_digest is not None:
        return Reason.RUNTIME_UNAVAILABLE, f"runtime {needs.runtime_name!r}: this node advertises no runtimes"
    if not needs.resources.empty:
        return Reason.RESOURCES_INSUFFICIENT, "this node advertises no resources"
    return None
