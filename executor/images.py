"""Build the sandbox image from Debian packages, with no registry.

There is no container registry to pull from, so the image is a Debian bookworm `minbase` root file system made by
`debootstrap` (python3 + nodejs) and imported into Docker through the SDK with `USER 65534:65534` and
`WORKDIR /tmp`. The root file system is cached as a tarball so that a rebuild (for example after
`docker image rm`) only re-imports it.

    python -m executor.images build [--tag TAG] [--rebuild]
"""

from __future__ import annotations

import argparse
import contextlib
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

SANDBOX_USER = "65534:65534"
SUITE = "bookworm"
PACKAGES = ("python3", "nodejs")
# The cache key names everything that shapes the tree, so a change of packages never reuses a stale tarball.
ROOTFS_TARBALL = f"rootfs-{SUITE}-minbase-{'-'.join(PACKAGES)}.tar"

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


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    progress: Callable[[str], None],
    rebuild: bool = False,
    client: docker.APIClient | None = None,
) -> None:
    """Make `tag` from the cached root file system tarball, creating the tarball with debootstrap if needed."""
    tarball = cache_dir() / ROOTFS_TARBALL
    if rebuild or not tarball.is_file():
        _bootstrap_tarball(tarball, progress)
    else:
        progress(f"using cached root file system {tarball}")
    progress(f"importing {tarball} as {tag}")
    with _client(client) as api:
        try:
            api.import_image(src=str(tarball), repository=tag, changes=[f"USER {SANDBOX_USER}", "WORKDIR /tmp"])
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise ImageError(f"cannot import the image into Docker: {exc}") from exc
        user = image_user(tag, client=api)
    if user != SANDBOX_USER:
        raise ImageError(f"imported image {tag} has user {user!r}, expected {SANDBOX_USER}")
    progress(f"built {tag} (user {user})")


def _bootstrap_tarball(tarball: Path, progress: Callable[[str], None]) -> None:
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
        command = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs)]
        progress("running " + " ".join(command))
        _run_streaming(command, progress)
        _harden_tree(rootfs)
        partial = tarball.with_suffix(".partial")
        progress(f"packing {tarball}")
        # numeric owners: the tree's uids are the image's uids, whatever this host's /etc/passwd says.
        _run_streaming(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], progress)
        partial.replace(tarball)


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
