#!/usr/bin/env bash
# twofold top's own CPU over 30 s at --interval 1s: runs it in a detached tmux session
# against a copying and a mapping reader of a 64 MiB file, reads utime+stime of the top
# process from /proc/PID/stat before and after, and prints CPU seconds and percent of
# one core. Usage: bench/top.sh [path/to/twofold] [seconds]
set -euo pipefail
bin=${1:-target/release/twofold}
secs=${2:-30}
tck=$(getconf CLK_TCK)
dir=$(mktemp -d)
sock="twofold-bench-$$"
cleanup() { tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
head -c $((64 << 20)) /dev/urandom >"$dir/m.safetensors"
tmux -L "$sock" new-session -d -s kids -x 80 -y 24 "sleep 100000 | $bin __child copy $dir/m.safetensors --close"
tmux -L "$sock" new-window -t kids "sleep 100000 | $bin __child map $dir/m.safetensors"
tmux -L "$sock" new-window -t kids "echo \$\$ > $dir/pid; exec $bin top --interval 1s $dir/m.safetensors"
for _ in $(seq 100); do [ -s "$dir/pid" ] && break; sleep 0.1; done
pid=$(cat "$dir/pid")
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
sleep 2 # past start-up
t0=$(ticks)
sleep "$secs"
t1=$(ticks)
awk -v a="$t0" -v b="$t1" -v hz="$tck" -v s="$secs" \
  'BEGIN { c = (b - a) / hz; printf "twofold top: %.2f s CPU in %d s at --interval 1s = %.1f%% of one core\n", c, s, 100 * c / s }'
