#!/usr/bin/env bash
# Runs several twofold binaries at once against one live host (bench/host.sh with HOLD=...),
# so that each sees the same moments of the host, and prints each one's CPU over the same
# window (utime + stime of /proc/PID/stat). Several collectors beside each other load the
# machine more than one alone: compare the binaries with each other, not with a lone run.
#
#   bench/ab-together.sh serve|record WINDOW_S BINARY...
set -euo pipefail
MODE=$1; WIN=$2; shift 2
tmp=$(mktemp -d)
# The binaries share one point cache: the caller's, or one of this run's, removed with it.
export TWOFOLD_INDEX_CACHE="${TWOFOLD_INDEX_CACHE:-$tmp/index-cache}"
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
P=(); port=9990
trap '[ ${#P[@]} -eq 0 ] || kill "${P[@]}" 2>/dev/null || true; wait || true; rm -rf "$tmp"' EXIT
for B in "$@"; do
  case $MODE in
    serve) "$B" serve --interval 5s --listen "127.0.0.1:$port" >/dev/null 2>&1 & P+=($!) ;;
    record) "$B" record --interval 1s --store "$tmp/store-$port" >/dev/null 2>&1 & P+=($!) ;;
    *) echo "mode: serve or record" >&2; exit 2 ;;
  esac
  port=$((port + 1))
done
sleep 75
A=(); for p in "${P[@]}"; do A+=("$(ticks "$p")"); done
sleep "$WIN"
i=0
for B in "$@"; do
  b=$(ticks "${P[$i]}")
  python3 -c "print(f'$MODE $B: {($b-${A[$i]})/$(getconf CLK_TCK)/$WIN*100:.2f}%')"
  i=$((i + 1))
done
