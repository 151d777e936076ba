#!/usr/bin/env bash
# twofold top's own CPU beside htop's and btop's, in the same run, on the bench workload:
# 500 extra processes (200 mapping one 64 MiB file, 300 holding 1 MiB of anonymous
# memory; bench/spawn_readers.py) plus a copying and a mapping reader of the file. Each
# tool runs in its own detached tmux session at 160x48, refreshing every second
# (`twofold top --interval 1s`, `htop -d 10`, btop with update_ms=1000), all showing the
# same processes. utime+stime of each from /proc/PID/stat before and after SECONDS (after
# a warm-up) gives its CPU as a percent of one core. Then the frame time (draw only) at
# 160x48 and 80x24 over ratatui's TestBackend (examples/top_frame.rs) on the same workload.
# Usage: bench/top.sh [path/to/twofold (release)] [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/twofold}
secs=${2:-60}
command -v htop >/dev/null && command -v btop >/dev/null || apt-get install -y htop btop >/dev/null
tck=$(getconf CLK_TCK)
dir=$(mktemp -d /var/tmp/twofold-bench-top.XXXXXX)
sock="twofold-bench-top-$$"
helper=""
cleanup() {
  tmux -L "$sock" kill-server 2>/dev/null || true
  [ -n "$helper" ] && kill "$helper" 2>/dev/null && wait "$helper" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
head -c $((64 << 20)) /dev/urandom >"$dir/m.safetensors"
python3 bench/spawn_readers.py --twofold "$bin" --file "$dir/m.safetensors" \
  --map 200 --anon 300 --anon-bytes 1M --ready-file "$dir/ready" --pid-file "$dir/pids" &
helper=$!
for _ in $(seq 1 1200); do [ -e "$dir/ready" ] && break; sleep 0.1; done
[ -e "$dir/ready" ] || { echo "readers not ready" >&2; exit 1; }
t() { tmux -L "$sock" "$@"; }
t new-session -d -s kids -x 160 -y 48 "sleep 100000 | $bin __child copy $dir/m.safetensors --close"
t new-window -t kids "sleep 100000 | $bin __child map $dir/m.safetensors"
# btop: its own config (1 s refresh), so the user's is neither read nor changed.
mkdir -p "$dir/cfg/btop"
printf 'update_ms = 1000\ncolor_theme = "Default"\n' >"$dir/cfg/btop/btop.conf"
t new-session -d -s top -x 160 -y 48 "echo \$\$ > $dir/pid.top; exec $bin top --interval 1s $dir/m.safetensors"
t new-session -d -s htop -x 160 -y 48 "echo \$\$ > $dir/pid.htop; exec htop -d 10"
t new-session -d -s btop -x 160 -y 48 "echo \$\$ > $dir/pid.btop; XDG_CONFIG_HOME=$dir/cfg exec btop"
for f in top htop btop; do
  for _ in $(seq 100); do [ -s "$dir/pid.$f" ] && break; sleep 0.1; done
done
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
sleep 5 # past start-up (and top's first proof)
declare -A t0
for f in top htop btop; do t0[$f]=$(ticks "$(cat "$dir/pid.$f")"); done
sleep "$secs"
declare -A t1
for f in top htop btop; do t1[$f]=$(ticks "$(cat "$dir/pid.$f")"); done
procs=$(ls -d /proc/[0-9]* | wc -l)
echo "$procs processes on the machine; $secs s at a 1 s refresh, 160x48, same run"
echo "| tool | CPU s | % of one core | vs htop |"
echo "|---|---|---|---|"
for f in top htop btop; do
  awk -v n="$f" -v a="${t0[$f]}" -v b="${t1[$f]}" -v ha="${t0[htop]}" -v hb="${t1[htop]}" \
    -v hz="$tck" -v s="$secs" 'BEGIN {
      c = (b - a) / hz; h = (hb - ha) / hz
      name = (n == "top") ? "twofold top --interval 1s" : (n == "htop") ? "htop -d 10" : "btop (update_ms 1000)"
      printf "| %s | %.2f | %.2f%% | %s |\n", name, c, 100 * c / s, (h > 0) ? sprintf("%.2fx", c / h) : "n/a (htop used none)"
    }'
done
tmux -L "$sock" kill-session -t top
tmux -L "$sock" kill-session -t htop
tmux -L "$sock" kill-session -t btop
# Frame time, draw only, on the same workload.
frame=${bin%/twofold}/examples/top_frame
[ -x "$frame" ] || cargo build --release --quiet --example top_frame
"$frame" "$dir/m.safetensors" 500
