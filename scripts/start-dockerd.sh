#!/usr/bin/env bash
# Start a dockerd of our own, with the gVisor runtime (runsc) registered, and wait until it answers.
#
#   scripts/start-dockerd.sh DAEMON_JSON LOG [dockerd arguments...]
#
# scripts/setup.sh runs `scripts/start-dockerd.sh /etc/docker/daemon.json /var/log/dockerd.log` on a machine where
# no daemon answers; tests start a private daemon with it on a socket of their own (--host, --data-root, ...).
# runsc is registered in DAEMON_JSON, not with `--add-runtime runsc=/usr/bin/runsc`: that flag carries no runtime
# arguments, and the gVisor tier needs `--network=none --oci-seccomp` (executor/backends/registration.py).
# Prints the daemon's pid. Needs root and the worktree's .venv (scripts/setup.sh makes it first).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 DAEMON_JSON LOG [dockerd arguments...]" >&2; exit 2; }
daemon_json=$1 log=$2
shift 2

if command -v runsc >/dev/null; then
  "$here/.venv/bin/python" -m executor.backends.registration --daemon-json "$daemon_json" >&2
else
  echo "no runsc on this machine (apt-get install runsc): the gVisor tier will be unavailable" >&2
fi

host="" previous=""
for arg in "$@"; do
  case "$previous" in --host|-H) host=$arg ;; esac
  case "$arg" in --host=*) host=${arg#--host=} ;; esac
  previous=$arg
done
answers() { timeout 5 docker ${host:+--host "$host"} info >/dev/null 2>&1; }

nohup dockerd --config-file "$daemon_json" "$@" >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
  answers && { echo "$pid"; exit 0; }
  kill -0 "$pid" 2>/dev/null || { echo "dockerd exited; see $log" >&2; tail -5 "$log" >&2; exit 1; }
  sleep 0.5
done
echo "dockerd did not answer within 60 s; see $log" >&2
exit 1
