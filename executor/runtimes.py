"""Runtimes: the package sets a node's operator declares, each its own sandbox image built from Debian packages.

An offer names a runtime (`python`, `python-science`, ...), never an image, a mount or a package: the 2025 runc
escapes needed an attacker-chosen image or mount, so the node runs only images its operator declared and built
(docs/runtimes.md, docs/threat-model.md). A runtime is a name and a list of Debian packages on top of the base
(python3 and nodejs, so that both languages run under every runtime); `executor/images.py` builds it with the same
debootstrap path as the base image, and labels the image with the installed packages and their versions.

Its identity on the mesh is the `digest` of that sorted `package=version` list: two nodes that built the same list
from the same Debian snapshot advertise the same digest, so an offer pinning one (`runtimeDigest`) gets the same
package set wherever it runs, which is what makes k-of-n agreement meaningful. The image id is advertised beside it;
it is not part of the pin because `docker import` stamps the import time into it, so it differs on every node.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_RUNTIME = "python"
# Every runtime has both interpreters: an offer's language and its runtime are independent choices.
BASE_PACKAGES = ("nodejs", "python3")
# What a data-science user expects to import, as Debian packages it (bookworm): arrays, scientific routines, data
# frames, classical machine learning, symbolic maths and graphs. matplotlib is left out: nothing can be shown from a
# sandbox with no network and no mount, and it pulls in fonts and image libraries (an operator may add it).
SCIENCE_PACKAGES = (
    "python3-networkx",
    "python3-numpy",
    "python3-pandas",
    "python3-scipy",
    "python3-sklearn",
    "python3-sympy",
)
IMAGE_REPOSITORY = "edgecoder-sandbox"
# The labels `executor/images.py` writes on a runtime's image, read back to advertise it.
RUNTIME_LABEL = "edgecoder.runtime"
PACKAGES_LABEL = "edgecoder.packages"
DIGEST_LABEL = "edgecoder.packages-digest"
MAX_RUNTIMES = 8
MAX_PACKAGES = 64  # per runtime, as the operator lists them (their dependencies come on top)
NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,31}")
# Debian policy 5.6.1: lower case letters, digits, + - . ; at least two characters, starting alphanumeric.
PACKAGE_PATTERN = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}")


@dataclass(frozen=True, slots=True)
class Runtime:
    """A runtime as the operator declares it: a name and the Debian packages it adds to the base.

    `image` is the tag it is built as; by default it names the package list (`edgecoder-sandbox:NAME-KEY`), so a
    changed list is a new tag and a rebuild, and an unchanged one is found in the cache.
    """

    name: str
    packages: tuple[str, ...] = ()
    image: str = field(default="")

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"runtime name {self.name!r}: lower case letters, digits and '-', at most 32")
        bad = [p for p in self.packages if not isinstance(p, str) or not PACKAGE_PATTERN.fullmatch(p)]
        if bad:
            raise ValueError(f"runtime {self.name}: {bad[0]!r} is not a Debian package name")
        if len(self.packages) > MAX_PACKAGES:
            raise ValueError(f"runtime {self.name}: at most {MAX_PACKAGES} packages")
        object.__setattr__(self, "packages", tuple(sorted(set(self.packages))))
        if not self.image:
            object.__setattr__(self, "image", f"{IMAGE_REPOSITORY}:{self.name}-{self.list_key}")

    @property
    def all_packages(self) -> tuple[str, ...]:
        """What debootstrap is asked to include: the base and this runtime's own, sorted."""
        return tuple(sorted({*BASE_PACKAGES, *self.packages}))

    @property
    def list_key(self) -> str:
        """A short name of the package list as declared (not of the versions installed): the cache key."""
        return hashlib.sha256("\n".join(self.all_packages).encode()).hexdigest()[:12]


def science_runtime() -> Runtime:
    return Runtime("python-science", SCIENCE_PACKAGES)


def parse_runtime(text: str) -> Runtime:
    """An operator's declaration: `NAME` for a built-in runtime (python, python-science), or `NAME=PKG PKG ...`
    for a runtime of those Debian packages. ValueError says what is wrong."""
    name, sep, listed = text.strip().partition("=")
    name = name.strip()
    if not sep:
        if name == DEFAULT_RUNTIME:
            return Runtime(DEFAULT_RUNTIME)
        if name == "python-science":
            return science_runtime()
        raise ValueError(f"{name!r} is no built-in runtime (python, python-science): declare NAME=PACKAGE ...")
    if name in (DEFAULT_RUNTIME, "python-science"):
        raise ValueError(f"{name!r} is built in: give your package list another name")
    packages = tuple(listed.split())
    if not packages:
        raise ValueError(f"runtime {name!r} lists no package")
    return Runtime(name, packages)


def check_runtimes(runtimes: Iterable[Runtime]) -> tuple[Runtime, ...]:
    """The declared runtimes, validated as a set: distinct names, at most MAX_RUNTIMES, `python` among them."""
    declared = tuple(runtimes)
    names = [r.name for r in declared]
    if len(set(names)) != len(names):
        raise ValueError(f"runtime names must be distinct, not {names}")
    if not 1 <= len(declared) <= MAX_RUNTIMES:
        raise ValueError(f"declare between 1 and {MAX_RUNTIMES} runtimes")
    if DEFAULT_RUNTIME not in names:
        raise ValueError(f"the {DEFAULT_RUNTIME!r} runtime is always declared (offers without a runtime use it)")
    return declared


def packages_digest(installed: Iterable[str]) -> str:
    """The runtime's digest: sha256 of its sorted `package=version` lines, as advertised and pinned by offers."""
    return hashlib.sha256("\n".join(sorted(installed)).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """A built runtime as this node advertises it."""

    name: str
    image: str
    image_id: str
    digest: str
    packages: tuple[str, ...]  # `package=version`, sorted: everything installed, dependencies too

    def to_json(self, *, with_packages: bool = True) -> dict[str, object]:
        shown: dict[str, object] = {"name": self.name, "digest": self.digest, "imageId": self.image_id}
        if with_packages:
            shown["packages"] = list(self.packages)
        return shown


def runtime_info(runtime: Runtime, inspected: dict[str, object]) -> RuntimeInfo | None:
    """The runtime as its image's inspection describes it; None when the image carries no package labels (built
    before runtimes existed, or not by `edgecoder image build`): it must be rebuilt before it is advertised."""
    config = inspected.get("Config") or {}
    labels = (config.get("Labels") if isinstance(config, dict) else None) or {}
    listed = labels.get(PACKAGES_LABEL) if isinstance(labels, dict) else None
    if not isinstance(listed, str) or not listed.strip():
        return None
    packages = tuple(sorted(listed.split()))
    digest = packages_digest(packages)
    if labels.get(DIGEST_LABEL) != digest:
        return None  # a label edited by hand: the list no longer proves what it claims
    return RuntimeInfo(runtime.name, runtime.image, str(inspected.get("Id", "")), digest, packages)
