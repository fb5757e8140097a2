"""Build the sandbox images from Debian packages, with no registry.

There is no container registry to pull from, so an image is a Debian bookworm `minbase` root file system made by
`debootstrap` (python3 + nodejs, plus the runtime's packages: executor/runtimes.py) and imported into Docker through
the SDK with `USER 65534:65534`, `WORKDIR /tmp` and labels listing every installed package with its version (read
by `dpkg-query` from the tree itself). The root file system is cached as a tarball named by its package list, so
that a rebuild (for example after `docker image rm`) only re-imports it, and a changed list never reuses it.

    python -m executor.images build [--tag TAG] [--rebuild]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import requests

from executor.policy import DEFAULT_IMAGE
from executor.runtimes import (
    BASE_PACKAGES,
    DEFAULT_RUNTIME,
    DIGEST_LABEL,
    PACKAGES_LABEL,
    RUNTIME_LABEL,
    Runtime,
    packages_digest,
)

SANDBOX_USER = "65534:65534"
SUITE = "bookworm"
PACKAGES = ("python3", "nodejs")
# The cache key names everything that shapes the tree, so a change of packages never reuses a stale tarball.
ROOTFS_TARBALL = f"rootfs-{SUITE}-minbase-{'-'.join(PACKAGES)}.tar"
DPKG_STATUS = "var/lib/dpkg/status"
# Debian package -> the module a parked interpreter imports before its task: what a program of that runtime
# imports first, slow to import (numpy: about 0.1 s of CPU), and small enough for the pool's 128 MiB containers
# (pandas and scipy are not: they are imported on demand).
PRELOADED = {"python3-numpy": "numpy"}

# Left out of the image: package caches and documentation (size), nothing the sandbox needs at run time.
_PRUNED_DIRS = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


class ImageError(Exception):
    """The image could not be built or inspected; the message says what to do."""


def cache_dir() -> Path:
    configured = os.environ.get("EDGECODER_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "edgecoder"


def image_present(tag: str, *, client: docker.APIClient | None = None) -> bool:
    return _image_exists(tag, client)


def image_user(tag: str, *, client: docker.APIClient | None = None) -> str | None:
    """The image's configured USER, or None when the image is absent (or has no USER at all)."""
    with _client(client) as api:
        try:
            info = api.inspect_image(tag)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise ImageError(f"cannot inspect image {tag}: {exc}") from exc
    user = (info.get("Config") or {}).get("User")
    return user or None


def rootfs_tarball(runtime: Runtime) -> Path:
    """The cached root file system of `runtime`, named by its package list (the base keeps its historic name)."""
    if not runtime.packages:
        return cache_dir() / ROOTFS_TARBALL
    return cache_dir() / f"rootfs-{SUITE}-minbase-{runtime.name}-{runtime.list_key}.tar"


def runtime_built(runtime: Runtime, *, client: docker.APIClient | None = None) -> bool:
    """Whether `runtime`'s image is present, runs as nobody and carries its package labels (the cache hit)."""
    with _client(client) as api:
        try:
            info = api.inspect_image(runtime.image)
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise ImageError(f"cannot inspect image {runtime.image}: {exc}") from exc
    config = info.get("Config") or {}
    labels = config.get("Labels") or {}
    return config.get("User") == SANDBOX_USER and bool(labels.get(PACKAGES_LABEL)) and bool(labels.get(DIGEST_LABEL))


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    progress: Callable[[str], None],
    rebuild: bool = False,
    client: docker.APIClient | None = None,
    runtime: Runtime | None = None,
) -> None:
    """Make `runtime`'s image (by default the base `python` runtime, as `tag`) from its cached root file system
    tarball, creating the tarball with debootstrap if needed."""
    runtime = runtime or Runtime(DEFAULT_RUNTIME, (), image=tag)
    tag = runtime.image
    tarball = rootfs_tarball(runtime)
    if rebuild or not tarball.is_file():
        _bootstrap_tarball(tarball, progress, runtime.all_packages)
    else:
        progress(f"using cached root file system {tarball}")
    installed = _installed_packages(tarball, progress)
    progress(f"importing {tarball} as {tag} ({len(installed)} packages)")
    changes = [
        f"USER {SANDBOX_USER}",
        "WORKDIR /tmp",
        # JSON strings: the Dockerfile parser takes them as they are (versions carry ':', '+' and '~').
        f"LABEL {RUNTIME_LABEL}={json.dumps(runtime.name)}",
        f"LABEL {PACKAGES_LABEL}={json.dumps(' '.join(installed))}",
        f"LABEL {DIGEST_LABEL}={json.dumps(packages_digest(installed))}",
    ]
    with _client(client) as api:
        try:
            api.import_image(src=str(tarball), repository=tag, changes=changes)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise ImageError(f"cannot import the image into Docker: {exc}") from exc
        user = image_user(tag, client=api)
    if user != SANDBOX_USER:
        raise ImageError(f"imported image {tag} has user {user!r}, expected {SANDBOX_USER}")
    progress(f"built {tag} (user {user}, packages digest {packages_digest(installed)[:16]})")


def _installed_packages(tarball: Path, progress: Callable[[str], None]) -> list[str]:
    """`package=version` of every package installed in the tree, sorted: dpkg's own reading of the tarball's
    status file (written beside the tarball, so that a re-import does not read the tarball again)."""
    listed = tarball.with_suffix(".packages")
    if listed.is_file():
        return sorted(listed.read_text(encoding="utf-8").split())
    progress(f"listing the packages of {tarball}")
    with tempfile.TemporaryDirectory(prefix="edgecoder-dpkg-") as workdir:
        # GNU tar takes the member as it was packed: "./var/lib/dpkg/status".
        _run_streaming(["tar", "-C", workdir, "-xf", str(tarball), f"./{DPKG_STATUS}"], progress)
        installed = _dpkg_installed(Path(workdir) / "var/lib/dpkg")
    partial = listed.with_suffix(".partial-packages")
    partial.write_text("\n".join(installed) + "\n", encoding="utf-8")
    partial.replace(listed)
    return installed


def _dpkg_installed(admindir: Path) -> list[str]:
    try:
        done = subprocess.run(
            ["dpkg-query", f"--admindir={admindir}", "-W", "-f=${db:Status-Abbrev} ${Package}=${Version}\n"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise ImageError(f"cannot run dpkg-query (apt-get install -y dpkg): {exc}") from exc
    if done.returncode != 0:
        raise ImageError(f"dpkg-query failed with exit {done.returncode}: {done.stderr.strip()}")
    # "ii " is installed and configured; anything else (half-installed, config-files) is not in the image's set.
    installed = sorted(line.split()[1] for line in done.stdout.splitlines() if line.startswith("ii "))
    if not installed:
        raise ImageError(f"no installed package found in {admindir}")
    return installed


def _bootstrap_tarball(
    tarball: Path, progress: Callable[[str], None], packages: tuple[str, ...] = BASE_PACKAGES
) -> None:
    debootstrap = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.path.exists(p)), None
    )
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root: run the image build as root")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgecoder-rootfs-") as workdir:
        rootfs = Path(workdir) / "rootfs"
        command = [debootstrap, "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(rootfs)]
        progress("running " + " ".join(command))
        _run_streaming(command, progress)
        installed = _dpkg_installed(rootfs / "var/lib/dpkg")
        _harden_tree(rootfs)
        _preload(rootfs, packages)
        partial = tarball.with_suffix(".partial")
        progress(f"packing {tarball}")
        # numeric owners: the tree's uids are the image's uids, whatever this host's /etc/passwd says.
        _run_streaming(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], progress)
        partial.replace(tarball)
        tarball.with_suffix(".packages").write_text("\n".join(installed) + "\n", encoding="utf-8")


def _harden_tree(rootfs: Path) -> None:
    """Prune caches and drop setuid/setgid bits: no-new-privileges already neuters them, this is depth."""
    for relative in _PRUNED_DIRS:
        target = rootfs / relative
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    for dirpath, _dirnames, filenames in os.walk(rootfs):
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))


def _preload(rootfs: Path, packages: tuple[str, ...]) -> None:
    """Have every python3 of the image import the runtime's heavy modules at start-up (a `.pth` line runs at site
    initialisation), so that a pool container's parked interpreter has done it before its task comes. The
    supervisor runs with -I -S and imports none of it."""
    modules = [module for package, module in PRELOADED.items() if package in packages]
    if not modules:
        return
    site = rootfs / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "edgecoder-preload.pth").write_text("".join(f"import {m}\n" for m in modules), encoding="ascii")


def _run_streaming(command: list[str], progress: Callable[[str], None]) -> None:
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise ImageError(f"cannot run {command[0]}: {exc}") from exc
    tail: list[str] = []
    with proc:  # closes our end of its stdout and reaps it, also when `progress` raises
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            progress(line)
    if proc.returncode != 0:
        raise ImageError(f"{command[0]} failed with exit {proc.returncode}:\n" + "\n".join(tail))


def _image_exists(tag: str, client: docker.APIClient | None) -> bool:
    with _client(client) as api:
        try:
            api.inspect_image(tag)
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise ImageError(f"cannot inspect image {tag}: {exc}") from exc
    return True


@contextlib.contextmanager
def _client(given: docker.APIClient | None) -> Iterator[docker.APIClient]:
    """The caller's client, or one of our own that is closed afterwards."""
    if given is not None:
        yield given
        return
    try:
        api = docker.APIClient(**docker.utils.kwargs_from_env())
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot reach the Docker daemon: {exc}") from exc
    try:
        yield api
    finally:
        api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m executor.images")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the sandbox image from Debian packages")
    build.add_argument("--tag", default=os.environ.get("EDGECODER_IMAGE", DEFAULT_IMAGE))
    build.add_argument("--rebuild", action="store_true", help="ignore the cached root file system")
    args = parser.parse_args(argv)
    try:
        build_image(args.tag, progress=lambda line: print(line, flush=True), rebuild=args.rebuild)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
