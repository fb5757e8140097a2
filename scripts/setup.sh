#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test`: quick when nothing needs doing.
#  - on Debian as root: the missing system packages (docker.io, iptables, debootstrap, libgmp-dev)
#  - the venv and the package (reinstalled only when pyproject.toml changes)
#  - dockerd, started when no daemon answers (root only; on a laptop, Docker is already running)
#  - the sandbox image, built from Debian packages when it is missing (no registry is needed)
#  - the js-libp2p peer of the interop tests, `npm ci` from its lock file (again when the lock changes)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
is_root() { [ "$(id -u)" = 0 ]; }

if is_root && command -v apt-get >/dev/null; then
  missing=()
  for pkg in docker.io iptables debootstrap libgmp-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PYTHON" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  say "installing edgecoder-mesh and its dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev]'
  touch .venv/.installed
fi

# The interop tests' js-libp2p peer: exact versions from tests/interop/js/package-lock.json. npm ci writes
# node_modules/.package-lock.json, so a lock newer than that file means the installed tree is out of date.
JS_PEER=tests/interop/js
if command -v npm >/dev/null; then
  if [ ! -f "$JS_PEER/node_modules/.package-lock.json" ] \
    || [ "$JS_PEER/package-lock.json" -nt "$JS_PEER/node_modules/.package-lock.json" ]; then
    say "installing the js-libp2p interop peer (npm ci in $JS_PEER)"
    (cd "$JS_PEER" && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  say "no npm: interop tests will skip (or fail under EDGECODER_REQUIRE_INTEROP=1)"
fi

docker_answers() { timeout 5 docker info >/dev/null 2>&1; }
if ! docker_answers; then
  if is_root && command -v dockerd >/dev/null; then
    say "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker_answers && break; sleep 1; done
    docker_answers || { say "dockerd did not answer within 60 s; see /var/log/dockerd.log"; exit 1; }
  else
    say "no Docker daemon answers: Docker tests will skip (or fail under EDGECODER_REQUIRE_DOCKER=1)"
    exit 0
  fi
fi

.venv/bin/edgecoder image build --if-missing
