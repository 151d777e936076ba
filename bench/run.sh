#!/usr/bin/env bash
# Benchmarks twofold against its peers, side by side in one run, with hyperfine:
#
#   1. whole-system scan with 500 extra processes (200 mapping a 64 MiB file, 300 with
#      1 MiB of anonymous memory): `twofold scan --all --json` and `twofold scan --json`
#      vs `smem -c "pid pss uss"`                                       goal: >= 10x
#   2. residency of one fully cached 8 GiB file: `twofold residency` vs `fincore` and
#      `vmtouch`                                                          goal: >= 20x
#   3. residency of 10,000 cached 64 KiB files in one directory:
#      `twofold residency -r --summary DIR` vs `vmtouch DIR` (and fincore via xargs)
#                                                                        goal: >= 2x
#
# Usage: bash bench/run.sh        (as root or not; needs ~9 GiB free disk and RAM)
# Env:   RUNS_SCAN, RUNS_BIG, RUNS_DIR  hyperfine --runs per benchmark (defaults below)
#        BIG_GIB                       size of the big file (default 8)
#        NO_BUILD=1                    skip `cargo build --release`
#
# Prints a Markdown table and writes it, with machine and exact commands, to
# bench/RESULTS.md. All temporary data lives in one `mktemp -d` directory that an EXIT
# trap removes (also on Ctrl-C / SIGTERM), after stopping every reader process.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
BIN=$ROOT/target/release/twofold

RUNS_SCAN=${RUNS_SCAN:-20}
RUNS_BIG=${RUNS_BIG:-50}
RUNS_DIR=${RUNS_DIR:-40}
WARMUP=2
BIG_GIB=${BIG_GIB:-8}
N_MAP=200
N_ANON=300
N_SMALL=10000

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

for tool in hyperfine smem fincore vmtouch python3 dd; do
    command -v "$tool" >/dev/null || die "missing tool: $tool (apt-get install -y $tool)"
done

# ---- where the data goes: a real disk filesystem, not tmpfs --------------------------
fs_type() { df --output=fstype "$1" | tail -n 1; }
BASE=""
for cand in /tmp /var/tmp; do
    case "$(fs_type "$cand")" in
        tmpfs|ramfs|overlay|overlayfs) continue ;;
        *) BASE=$cand; break ;;
    esac
done
[ -n "$BASE" ] || die "neither /tmp nor /var/tmp is on a disk filesystem"

need_kib=$(( (BIG_GIB + 1) * 1024 * 1024 ))
avail_kib=$(df -Pk "$BASE" | awk 'NR==2 {print $4}')
[ "$avail_kib" -ge "$need_kib" ] || die "$BASE has ${avail_kib} KiB free, need ${need_kib} KiB"
memavail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
[ "$memavail_kib" -ge $(( need_kib + 2 * 1024 * 1024 )) ] \
    || die "MemAvailable ${memavail_kib} KiB is too little to keep ${BIG_GIB} GiB cached"

# ---- cleanup, whatever happens -------------------------------------------------------
WORK=""
HELPER_PID=""
stop_readers() {
    if [ -n "$HELPER_PID" ]; then
        kill -TERM "$HELPER_PID" 2>/dev/null || true
        wait "$HELPER_PID" 2>/dev/null || true
        HELPER_PID=""
    fi
    # Belt and braces: any reader the helper left (it should leave none). Only pids that
    # are still our `twofold __child` processes, never a recycled pid.
    if [ -n "$WORK" ] && [ -f "$WORK/reader.pids" ]; then
        while read -r pid; do
            if tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q -- "__child"; then
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done < "$WORK/reader.pids"
        rm -f "$WORK/reader.pids"
    fi
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    stop_readers
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        rm -rf -- "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

WORK=$(mktemp -d "$BASE/twofold-bench.XXXXXX")
RES=$WORK/results
mkdir -p "$RES"
log "work directory: $WORK ($(fs_type "$WORK"))"

# ---- build ----------------------------------------------------------------------------
if [ "${NO_BUILD:-0}" != 1 ]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet)
fi
[ -x "$BIN" ] || die "no binary at $BIN"

# CPU load next to each benchmark: other work on a 2-core machine moves the numbers.
load_now() {
    local psi=""
    [ -r /proc/pressure/cpu ] && psi=", cpu PSI $(awk '/^some/ {print $2, $3}' /proc/pressure/cpu)"
    echo "loadavg $(cut -d' ' -f1-3 /proc/loadavg)$psi"
}

# hyperfine NAME RUNS CMD... : times the commands side by side, JSON to $RES/NAME.json.
# -N: no intermediate shell (its startup would swamp the ~1 ms commands); stdout goes to
# /dev/null through --output=null, which is what `CMD > /dev/null` would do.
bench() {
    local name=$1 runs=$2
    shift 2
    echo "$(load_now)" > "$RES/$name.load_before"
    hyperfine -N --output=null --warmup "$WARMUP" --runs "$runs" --style basic \
        --export-json "$RES/$name.json" "$@"
    echo "$(load_now)" > "$RES/$name.load_after"
}

# =======================================================================================
# 1. whole-system scan with 500 extra processes
# =======================================================================================
log "1. scan: starting $N_MAP map readers of a 64 MiB file and $N_ANON anon readers"
MODEL=$WORK/model.gguf
head -c 64M /dev/urandom > "$MODEL"
python3 "$BENCH/spawn_readers.py" --twofold "$BIN" --file "$MODEL" \
    --map "$N_MAP" --anon "$N_ANON" --anon-bytes 1M \
    --ready-file "$WORK/readers.ready" --pid-file "$WORK/reader.pids" &
HELPER_PID=$!
for _ in $(seq 1 1200); do
    [ -e "$WORK/readers.ready" ] && break
    kill -0 "$HELPER_PID" 2>/dev/null || die "reader helper exited before all were ready"
    sleep 0.1
done
[ -e "$WORK/readers.ready" ] || die "readers not ready after 120 s"
n_ready=$(cat "$WORK/readers.ready")
[ "$n_ready" -eq $((N_MAP + N_ANON)) ] || die "only $n_ready readers ready"
NPROC_SCAN=$(ls -d /proc/[0-9]* | wc -l)

# Sanity: twofold sees every holder, smem sees every process.
holders=$("$BIN" scan --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(len(d["processes"]))')
smem_rows=$(( $(smem -c "pid pss uss" | wc -l) - 1 ))
[ "$holders" -ge "$N_MAP" ] || die "twofold scan found only $holders holder processes"
[ "$smem_rows" -ge $((N_MAP + N_ANON)) ] || die "smem listed only $smem_rows processes"
log "processes: $NPROC_SCAN in /proc; twofold holders: $holders; smem rows: $smem_rows"

CMD_SCAN_ALL="$BIN scan --all --json"
CMD_SCAN="$BIN scan --json"
CMD_SMEM='smem -c "pid pss uss"'
bench scan "$RUNS_SCAN" -n "twofold scan --all" "$CMD_SCAN_ALL" \
    -n "twofold scan" "$CMD_SCAN" -n "smem" "$CMD_SMEM"
stop_readers
rm -f "$MODEL"

# =======================================================================================
# 2. residency of one fully cached 8 GiB file
# =======================================================================================
log "2. big file: writing ${BIG_GIB} GiB of real data (dd, fsync) and caching it"
BIG=$WORK/big.bin
dd if=/dev/zero of="$BIG" bs=16M count=$((BIG_GIB * 64)) conv=fsync status=none
vmtouch -tq "$BIG"
big_size=$(stat -c %s "$BIG")
big_res=$(fincore -b -n -o RES "$BIG" | tr -d ' ')
log "fincore: $big_res of $big_size bytes resident"
[ "$big_res" -ge $(( big_size / 100 * 99 )) ] || die "big file not fully cached ($big_res of $big_size)"
BIG_RESIDENT="$big_res of $big_size bytes"

CMD_BIG_TF="$BIN residency $BIG"
CMD_BIG_FINCORE="fincore $BIG"
CMD_BIG_VMTOUCH="vmtouch $BIG"
bench big "$RUNS_BIG" -n "twofold residency" "$CMD_BIG_TF" \
    -n "fincore" "$CMD_BIG_FINCORE" -n "vmtouch" "$CMD_BIG_VMTOUCH"
# Still cached after all runs? (nothing should have evicted it)
big_res_after=$(fincore -b -n -o RES "$BIG" | tr -d ' ')
BIG_RESIDENT_AFTER="$big_res_after of $big_size bytes"
rm -f "$BIG"

# =======================================================================================
# 3. 10,000 cached 64 KiB files in one directory
# =======================================================================================
log "3. small files: writing $N_SMALL files of 64 KiB"
SMALL=$WORK/small
mkdir "$SMALL"
python3 - "$SMALL" "$N_SMALL" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
buf = os.urandom(64 * 1024)
for i in range(n):
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(buf)
EOF
vmtouch -tq "$SMALL"
small_summary=$("$BIN" residency -r --summary "$SMALL")
vmtouch_summary=$(vmtouch "$SMALL" | awk '/Resident Pages/ {$1=$1; print}')
log "twofold: $small_summary | vmtouch: $vmtouch_summary"
SMALL_RESIDENT="twofold: $small_summary; vmtouch: $vmtouch_summary"

CMD_DIR_TF="$BIN residency -r --summary $SMALL"
CMD_DIR_VMTOUCH="vmtouch $SMALL"
CMD_DIR_FINCORE="sh -c 'find $SMALL -type f -print0 | xargs -0 fincore'"
bench dir "$RUNS_DIR" -n "twofold residency -r --summary" "$CMD_DIR_TF" \
    -n "vmtouch" "$CMD_DIR_VMTOUCH" -n "fincore (xargs)" "$CMD_DIR_FINCORE"

# =======================================================================================
# report
# =======================================================================================
export RES NPROC_SCAN holders smem_rows BIG_RESIDENT BIG_RESIDENT_AFTER SMALL_RESIDENT
export RUNS_SCAN RUNS_BIG RUNS_DIR WARMUP BIG_GIB N_MAP N_ANON N_SMALL WORK
export CMD_SCAN_ALL CMD_SCAN CMD_SMEM CMD_BIG_TF CMD_BIG_FINCORE CMD_BIG_VMTOUCH
export CMD_DIR_TF CMD_DIR_VMTOUCH CMD_DIR_FINCORE
export MACHINE_NPROC=$(nproc)
export MACHINE_KERNEL=$(uname -r)
export MACHINE_DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
export MACHINE_CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
export MACHINE_MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
export MACHINE_OS=$(. /etc/os-release && echo "$PRETTY_NAME")
export MACHINE_FS="$(fs_type "$WORK") on $(df -P "$WORK" | awk 'NR==2 {print $1}')"
export GIT_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
export GIT_DIRTY=$(cd "$ROOT" && git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null | wc -l)
export V_HYPERFINE=$(hyperfine --version)
export V_FINCORE=$(fincore --version)
export V_VMTOUCH=$(vmtouch 2>&1 | awk '/^vmtouch v/ {print $1, $2; exit}')
export V_SMEM="smem $(dpkg-query -W -f='${Version}' smem 2>/dev/null || echo '?')"
export V_TWOFOLD=$("$BIN" --version)

python3 - "$BENCH/RESULTS.md" <<'EOF'
import json, os, shlex, sys

E = os.environ
res = E["RES"]

def load(name):
    with open(os.path.join(res, name + ".json")) as f:
        return {r["command"]: r for r in json.load(f)["results"]}

scan, big, d = load("scan"), load("big"), load("dir")
ms = lambda r: r["median"] * 1000.0

rows = [
    # benchmark, twofold result, peer label, peer result, goal
    ("1. scan, 500 extra procs: `scan --all --json` vs smem",
     scan["twofold scan --all"], "smem", scan["smem"], 10),
    ("1. scan, 500 extra procs: `scan --json` (holders only) vs smem",
     scan["twofold scan"], "smem", scan["smem"], 10),
    (f"2. residency, one cached {E['BIG_GIB']} GiB file vs fincore",
     big["twofold residency"], "fincore", big["fincore"], 20),
    (f"2. residency, one cached {E['BIG_GIB']} GiB file vs vmtouch",
     big["twofold residency"], "vmtouch", big["vmtouch"], 20),
    (f"3. residency -r --summary, {int(E['N_SMALL']):,} x 64 KiB files vs vmtouch",
     d["twofold residency -r --summary"], "vmtouch", d["vmtouch"], 2),
    (f"3. residency -r --summary, {int(E['N_SMALL']):,} x 64 KiB files vs fincore (xargs, optional)",
     d["twofold residency -r --summary"], "fincore (xargs)", d["fincore (xargs)"], None),
]

table = ["| benchmark | twofold median (ms) | peer | peer median (ms) | ratio (peer/twofold) | goal |",
         "|---|---:|---|---:|---:|---|"]
for name, t, plabel, p, goal in rows:
    ratio = ms(p) / ms(t)
    if goal is None:
        g = "-"
    else:
        g = f"≥ {goal}× {'met' if ratio >= goal else '**missed**'}"
    table.append(f"| {name} | {ms(t):.1f} | {plabel} | {ms(p):.1f} | {ratio:.2f}× | {g} |")
table_md = "\n".join(table)
print()
print(table_md)

detail = ["| benchmark | command | median (ms) | mean ± σ (ms) | min (ms) | max (ms) | user (ms) | sys (ms) | runs |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
for bname, group in (("1. scan", scan), ("2. big file", big), ("3. directory", d)):
    for label, r in group.items():
        detail.append(
            f"| {bname} | {label} | {ms(r):.1f} | {r['mean']*1e3:.1f} ± {r['stddev']*1e3:.1f} "
            f"| {r['min']*1e3:.1f} | {r['max']*1e3:.1f} | {r['user']*1e3:.1f} | {r['system']*1e3:.1f} "
            f"| {len(r['times'])} |")
detail_md = "\n".join(detail)

work = E["WORK"]
def shown(cmd):
    # hyperfine -N splits each command into shell words; quoted here so that the line can
    # be pasted into a shell as is.
    return shlex.quote(cmd)

def load_at(name, when):
    try:
        with open(os.path.join(res, f"{name}.load_{when}")) as f:
            return f.read().strip()
    except OSError:
        return "?"

def hf(runs, *keys):
    lines = [f"hyperfine -N --output=null --warmup {E['WARMUP']} --runs {E[runs]} \\"]
    lines += [f"  {shown(E[k])}" + (" \\" if i < len(keys) - 1 else "")
              for i, k in enumerate(keys)]
    return lines

cmds = "\n".join(
    [f"# WORK={work}  (mktemp -d; removed at exit)",
     f"# 1. scan: {E['N_MAP']} x `twofold __child map $WORK/model.gguf` (64 MiB, random data) and",
     f"#    {E['N_ANON']} x `twofold __child anon --bytes 1M` alive (bench/spawn_readers.py)"]
    + hf("RUNS_SCAN", "CMD_SCAN_ALL", "CMD_SCAN", "CMD_SMEM")
    + ["",
       f"# 2. big file: dd if=/dev/zero of=$WORK/big.bin bs=16M count={int(E['BIG_GIB'])*64} conv=fsync; vmtouch -tq $WORK/big.bin"]
    + hf("RUNS_BIG", "CMD_BIG_TF", "CMD_BIG_FINCORE", "CMD_BIG_VMTOUCH")
    + ["",
       f"# 3. directory: {E['N_SMALL']} files x 64 KiB (random data) in $WORK/small; vmtouch -tq $WORK/small"]
    + hf("RUNS_DIR", "CMD_DIR_TF", "CMD_DIR_VMTOUCH", "CMD_DIR_FINCORE"))

loads = "\n".join(
    f"- {label}: before {load_at(n, 'before')}; after {load_at(n, 'after')}"
    for n, label in (("scan", "1. scan"), ("big", "2. big file"), ("dir", "3. directory")))

dirty = int(E["GIT_DIRTY"])
doc = f"""# twofold benchmark results

Produced by `bash bench/run.sh` (all three benchmarks in one run, each measured side by
side in one hyperfine invocation, `--warmup {E['WARMUP']}`; medians from `--export-json`).
Ratio = peer median / twofold median; above 1 means twofold is faster.

{table_md}

## Machine

- date: {E['MACHINE_DATE']}
- nproc: {E['MACHINE_NPROC']}
- kernel (`uname -r`): {E['MACHINE_KERNEL']}
- OS: {E['MACHINE_OS']}
- CPU: {E['MACHINE_CPU']}
- memory: {E['MACHINE_MEM']}
- data filesystem: {E['MACHINE_FS']}
- twofold: {E['V_TWOFOLD']} (git {E['GIT_REV']}{', src/Cargo.toml/Cargo.lock modified in the working tree' if dirty else ''}), `cargo build --release`
- peers: {E['V_SMEM']}, {E['V_FINCORE']}, {E['V_VMTOUCH']}; {E['V_HYPERFINE']}

## CPU load around each benchmark

hyperfine runs all runs of one command before the next, so load from other work during
the run can favour one side; the load average and CPU pressure (PSI) at the start and
end of each benchmark:

{loads}

## Sanity checks

- scan: {E['NPROC_SCAN']} processes in /proc during the scan benchmark; `twofold scan --json`
  reported {E['holders']} holder processes; smem listed {E['smem_rows']} processes.
- big file resident before timing (fincore): {E['BIG_RESIDENT']}; after: {E['BIG_RESIDENT_AFTER']}.
- directory: {E['SMALL_RESIDENT']}.

## Exact commands

As run (paths are those of this run; the binary is this repository's
`target/release/twofold`). `-N` runs each command without an intermediate shell and
`--output=null` sends its stdout to /dev/null, i.e. the same as `CMD > /dev/null`
without the cost of a shell per run (which would swamp the ~1 ms commands).

```sh
{cmds}
```

## All measurements

{detail_md}
"""
with open(sys.argv[1], "w") as f:
    f.write(doc)
print(f"\nwritten: {sys.argv[1]}", file=sys.stderr)
EOF
