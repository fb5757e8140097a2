#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test`: quick when nothing needs doing.
#  - on Debian as root: the missing system packages (docker.io, iptables, debootstrap, libgmp-dev), in the
#    background while the venv installs; then runsc with the systrap platform: on bookworm from Debian's
#    bookworm-backports suite (added on the mirror apt already uses; bookworm's own runsc has ptrace only); setup
#    refuses, and says why, when that package cannot be had
#  - the venv and the package (reinstalled only when pyproject.toml changes)
#  - dockerd, started when no daemon answers (root only; on a laptop, Docker is already running), with the gVisor
#    runtime runsc registered in /etc/docker/daemon.json (scripts/start-dockerd.sh); a running daemon that lacks
#    that registration gets it in daemon.json, and a reload (SIGHUP: no restart) when setup started that daemon
#    (it runs `dockerd --config-file` that file); otherwise a note to reload it. Setup never restarts a daemon.
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
# The first runsc with the systrap platform in Debian (executor/backends/gvisor.py registers --platform=systrap).
RUNSC_MIN=0.0~20240729
runsc_has_systrap() {
  local version
  version=$(dpkg-query -W -f '${Version}' runsc 2>/dev/null) || return 1
  dpkg --compare-versions "$version" ge "$RUNSC_MIN"
}
# The URI of the Debian mirror apt already uses for bookworm (one-line or deb822 sources), or nothing.
bookworm_mirror() {
  {
    awk '$1 == "deb" && / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; exit } }' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk '/^URIs:/ { u = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") s = 1 }
           /^[[:space:]]*$/ { if (u && s) { print u; exit } u = ""; s = 0 } END { if (u && s) print u }' "$f"
    done
  } | head -n 1
}
BACKPORTS_SOURCES=/etc/apt/sources.list.d/edgecoder-bookworm-backports.sources
install_runsc() {
  local codename target=()
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ "$codename" = bookworm ]; then
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      local mirror
      mirror=$(bookworm_mirror)
      if [ -z "$mirror" ]; then
        say "cannot install runsc with systrap: no Debian mirror for bookworm in apt's sources to add" \
          "bookworm-backports on (add 'deb <mirror> bookworm-backports main' and run setup again)"
        exit 1
      fi
      say "adding bookworm-backports ($mirror) to apt's sources for runsc $RUNSC_MIN (systrap)"
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
        "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg >"$BACKPORTS_SOURCES"
    fi
    target=(-t bookworm-backports)
  fi
  say "installing runsc >= $RUNSC_MIN ${target[*]:+from ${target[1]}}"
  apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${target[@]}" runsc >/dev/null \
    || ! runsc_has_systrap; then
    say "cannot install runsc >= $RUNSC_MIN (the first Debian build with the systrap platform) on" \
      "${codename:-this system}: apt has $(apt-cache policy runsc 2>/dev/null | awk '/Candidate:/ { print $2 }')." \
      "The gVisor tier needs it; see docs/executor.md"
    exit 1
  fi
}

if is_root && command -v apt-get >/dev/null; then
  missing=()
  for pkg in docker.io iptables debootstrap libgmp-dev; do
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
if is_root && command -v apt-get >/dev/null; then
  runsc_has_systrap || install_runsc
fi
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
elif command -v runsc >/dev/null && is_root; then
  # A running daemon: register runsc in its daemon.json; it reloads that file (SIGHUP) when setup started it.
  .venv/bin/python -m executor.backends.registration --daemon-json "$DAEMON_JSON" --reload-setup-daemon
elif command -v runsc >/dev/null && ! timeout 5 docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
  say "the running dockerd has no runsc runtime (gVisor), and only root can register it (run setup as root, or" \
    "see docs/executor.md). Until then gVisor tests skip (or fail under EDGECODER_REQUIRE_GVISOR=1)."
fi

.venv/bin/edgecoder image build --if-missing
