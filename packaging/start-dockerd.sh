#!/usr/bin/env bash
# Make sure a Docker daemon is reachable; install docker.io and start dockerd
# in the background if needed.  Idempotent.
#
#   BAI_DOCKERD_LOG   dockerd log file (default /tmp/bai-dockerd.log)
#   BAI_DOCKERD_ARGS  extra dockerd arguments (word-split), e.g. "--storage-driver=vfs"
#   BAI_DOCKERD_WAIT  seconds to wait for the daemon (default 60)
set -euo pipefail

LOG="${BAI_DOCKERD_LOG:-/tmp/bai-dockerd.log}"
WAIT="${BAI_DOCKERD_WAIT:-60}"

log() { echo "[start-dockerd] $*"; }

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    log "docker daemon already running"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    log "installing docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q docker.io
fi

# A dockerd that is still starting up owns the pid file; don't start a second one.
running_pid=""
if [ -s /var/run/docker.pid ]; then
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        running_pid="$pid"
    fi
fi

if [ -n "$running_pid" ]; then
    log "dockerd already started (pid $running_pid); waiting for it"
else
    log "starting dockerd (log: $LOG)"
    mkdir -p "$(dirname "$LOG")"
    # shellcheck disable=SC2086  # BAI_DOCKERD_ARGS is intentionally word-split
    setsid nohup dockerd ${BAI_DOCKERD_ARGS:-} >>"$LOG" 2>&1 </dev/null &
    disown || true
fi

for _ in $(seq 1 "$WAIT"); do
    if docker info >/dev/null 2>&1; then
        log "docker daemon is up ($(docker info --format '{{.ServerVersion}}, storage {{.Driver}}' 2>/dev/null || echo '?'))"
        exit 0
    fi
    sleep 1
done

log "ERROR: docker daemon did not come up within ${WAIT}s; last lines of $LOG:" >&2
tail -n 50 "$LOG" >&2 || true
exit 1
