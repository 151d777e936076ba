#!/usr/bin/env bash
# top beside a 1 GiB copier whose memory keeps changing (`__child copy --drift`): its CPU
# over 60 s and what the proof cadence did (TWOFOLD_PROFILE). Usage: bash bench/top-drift.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/twofold}
dir=$(mktemp -d /var/tmp/twofold-drift.XXXXXX)
sock="twofold-drift-$$"
cleanup() { tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
head -c $((1 << 30)) /dev/urandom >"$dir/m.gguf"
t() { tmux -L "$sock" "$@"; }
t new-session -d -s kids -x 160 -y 48 "sleep 100000 | $bin __child copy $dir/m.gguf --close --drift"
sleep 3
t new-session -d -s top -x 160 -y 48 "echo \$\$ > $dir/pid.top; exec env TWOFOLD_PROFILE=1 $bin top --interval 1s $dir/m.gguf 2>$dir/err"
for _ in $(seq 100); do [ -s "$dir/pid.top" ] && break; sleep 0.1; done
sleep 10
pid=$(cat "$dir/pid.top")
a=$(awk '{print $14+$15}' /proc/$pid/stat)
sleep 60
b=$(awk '{print $14+$15}' /proc/$pid/stat)
hz=$(getconf CLK_TCK)
echo "top CPU: $((b - a)) ticks in 60 s = $(awk -v t=$((b - a)) -v hz="$hz" 'BEGIN { printf "%.2f", t / hz / 60 * 100 }')% of a core"
grep -E "proof" "$dir/err" | sort | uniq -c | sort -rn | head -8
t capture-pane -p -t top | head -8
