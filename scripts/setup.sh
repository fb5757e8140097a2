#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test`: quick when nothing needs doing.
#  - on Debian as root: the missing system packages (docker.io, iptables, debootstrap, libgmp-dev, runsc), in the
#    background while the venv installs
#  - the venv and the package (reinstalled only when pyproject.toml changes)
#  - dockerd, started when no daemon answers (root only; on a laptop, Docker is already running), with the gVisor
#    runtime runsc registered in /etc/docker/daemon.json (scripts/start-dockerd.sh); a running daemon that lacks
#    runsc gets the same entry in daemon.json and a note to reload it: setup never restarts a daemon it did not start
#  - the sandbox image, built from Debian packages when it is missing (no registry is needed)
#  - the js-libp2p peer of the interop tests, `npm ci` from its lock file (again when the lock changes)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
is_root() { [ "$(id -u)" = 0 ]; }

# The system packages and the venv are independent (minutes each on a fresh machine), so apt runs in the
# background while pip installs; only libgmp-dev (fastecdsa builds against it when pip finds no wheel) must be
# there before pip starts. dpkg's --force-unsafe-io skips the fsync after every file: a crash mid-install is
# redone by the next run, and it saves much of the unpacking time on a slow disk.
apt_pid="" apt_log=""
if is_root && command -v apt-get >/dev/null; then
  missing=()
  for pkg in docker.io iptables debootstrap libgmp-dev runsc; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt_log=$(mktemp /tmp/edgecoder-setup-apt.XXXXXX)
    (
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-unsafe-io "${missing[@]}"
    ) >"$apt_log" 2>&1 &
    apt_pid=$!
  fi
fi
apt_done() {
  [ -n "$apt_pid" ] || return 0
  if ! wait "$apt_pid"; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    say "apt-get failed (above)"
    exit 1
  fi
  apt_pid=""
  rm -f "$apt_log"
}
case " ${missing[*]:-} " in *" libgmp-dev "*) apt_done ;; esac

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

apt_done  # dockerd, runsc and debootstrap are needed from here on
docker_answers() { timeout 5 docker info >/dev/null 2>&1; }
DAEMON_JSON=${EDGECODER_DAEMON_JSON:-/etc/docker/daemon.json}
if ! docker_answers; then
  if is_root && command -v dockerd >/dev/null; then
    say "starting dockerd with runsc registered in $DAEMON_JSON (log: /var/log/dockerd.log)"
    scripts/start-dockerd.sh "$DAEMON_JSON" /var/log/dockerd.log >/dev/null
  else
    say "no Docker daemon answers: Docker tests will skip (or fail under EDGECODER_REQUIRE_DOCKER=1)"
    exit 0
  fi
elif command -v runsc >/dev/null && ! timeout 5 docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
  # A daemon we did not start (or started before runsc was installed): register runsc for its next reload.
  if is_root; then
    .venv/bin/python -m executor.backends.registration --daemon-json "$DAEMON_JSON"
  fi
  say "the running dockerd has no runsc runtime (gVisor). It was not started by this run of setup.sh, so it is" \
    "not restarted: reload it to read $DAEMON_JSON (runtimes reload without a restart: kill -HUP <dockerd pid>," \
    "or systemctl reload docker). Until then gVisor tests skip (or fail under EDGECODER_REQUIRE_GVISOR=1)."
fi

.venv/bin/edgecoder image build --if-missing
