#!/usr/bin/env bash
# Leftovers after kill -9: for each campaign kind (run, pressure readers, demo), start it 20
# times and SIGKILL it once its cgroup or temp dir exists (each start sweeps what the one
# before left), then run one cheap campaign and count what is left of the killed runs:
# cgroups and temp dirs named twofold-PID-*, and processes of theirs (goal: 0).
# Needs root (cgroups). Usage: bash bench/leftovers.sh [KILLS]   (TWOFOLD=path to a binary)
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-20}
if [ -z "${TWOFOLD:-}" ]; then cargo build --quiet; fi
bin=${TWOFOLD:-$PWD/target/debug/twofold}
marker="tf-bench-leftovers-$$"
work=$(mktemp -d "/var/tmp/$marker.XXXXXX")
trap 'rm -rf "$work"' EXIT
head -c 8M /dev/urandom > "$work/m.bin"
ln -s /bin/sleep "$work/$marker-sleep"
sleeper="$work/$marker-sleep"

# Paths named after a pid: cgroups (v1 memory, v2) and temp dirs.
artifacts() {
  local pid=$1
  find /sys/fs/cgroup/memory /sys/fs/cgroup/unified -maxdepth 2 -type d -name "twofold-$pid-*" 2>/dev/null || true
  find "${TMPDIR:-/tmp}" -maxdepth 1 -type d -name "twofold-$pid-*" 2>/dev/null || true
}
cgroup_procs() {
  local n=0 d
  for d in $(artifacts "$1" | grep '^/sys/fs/cgroup' || true); do
    n=$((n + $(wc -l < "$d/cgroup.procs")))
  done
  echo "$n"
}
# Live processes (not zombies) whose command line names the marker or a killed pid's dir.
procs_of() {
  local pattern=$1 p n=0
  for p in $(pgrep -f -- "$pattern" || true); do
    [ "$p" = "$$" ] && continue
    grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && continue
    [ -e "/proc/$p" ] && n=$((n + 1))
  done
  echo "$n"
}

one_kind() {
  local kind=$1 i pid left_after_kill=0 pids=()
  for i in $(seq 1 "$kills"); do
    case $kind in
      run) "$bin" run --memory-max 128M -- sh -c "$sleeper 1000 & exec $sleeper 1001" >/dev/null 2>>"$work/$kind.err" & ;;
      pressure) "$bin" pressure "$work/m.bin" --experiment readers --readers 3,3,3,3,3,3,3,3,3,3 --memory-max 256M >/dev/null 2>>"$work/$kind.err" & ;;
      demo) "$bin" demo --size 64M >/dev/null 2>>"$work/$kind.err" & ;;
    esac
    pid=$!
    pids+=("$pid")
    for _ in $(seq 1 3000); do
      case $kind in
        run) [ "$(cgroup_procs "$pid")" -ge 2 ] && break ;;
        pressure) [ "$(cgroup_procs "$pid")" -ge 1 ] && break ;;
        demo) [ -n "$(artifacts "$pid")" ] && [ "$(procs_of "twofold-$pid-")" -ge 1 ] && break ;;
      esac
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.01
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    left_after_kill=$((left_after_kill + $(artifacts "$pid" | wc -l)))
  done
  # The next run: a cheap campaign.
  "$bin" run --memory-max 64M -- true >/dev/null 2>>"$work/$kind.err"
  sleep 0.5
  local cg=0 dirs=0 procs=0 p
  for p in "${pids[@]}"; do
    cg=$((cg + $(artifacts "$p" | grep -c '^/sys/fs/cgroup' || true)))
    dirs=$((dirs + $(artifacts "$p" | grep -vc '^/sys/fs/cgroup' || true)))
    procs=$((procs + $(procs_of "twofold-$p-")))
  done
  procs=$((procs + $(procs_of "$marker")))
  local reported
  reported=$(grep -c 'leftover' "$work/$kind.err" || true)
  printf '%-9s %3d SIGKILLs: %3d cgroups/dirs left right after the kills, %3d sweep lines; after the next run: %d leftovers (%d cgroups, %d temp dirs, %d processes)\n' \
    "$kind" "$kills" "$left_after_kill" "$reported" $((cg + dirs + procs)) "$cg" "$dirs" "$procs"
}

for kind in run pressure demo; do one_kind "$kind"; done
