#!/usr/bin/env python3
"""The measuring half of bench/host.sh: each tool's CPU and RSS beside its peers, in one run.

Usage: host_measure.py BIN WORKDIR   (settings from the environment, see bench/host.sh)

Phases, one after another, on the moving host that bench/host_workload.py keeps up:
1. scan: SCANS bare `twofold scan --json MODELS SMALL` (the default proof), wall time,
   CPU and peak RSS (wait4 of the child), and each file's count against the truth: the
   page-cache resident fraction from util-linux `fincore` right after, plus the private
   copies the workload made (truth.json). Then one `twofold scan --json` with no paths.
2. top: `twofold top --interval 1s MODELS SMALL`, `htop -d 10` and btop (update_ms 1000),
   each in a detached tmux session at 160x48, together; WARMUP s, then WINDOW s.
3. serve: `twofold serve --interval 5s`, prometheus-node-exporter and
   prometheus-process-exporter, together, each scraped every 5 s during WINDOW; every
   twofold scrape's counts are checked against the truth as in 1.
4. record: `twofold record --interval 1s MODELS SMALL` alone, WARMUP s then WINDOW s.
CPU = utime+stime of /proc/PID/stat over the window, in % of one core; RSS = VmHWM (peak)
of /proc/PID/status at the window's end. Every pid it starts is appended to
WORKDIR/tool-pids, so host.sh's trap can end them if this script is interrupted.
"""

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

BIN, WORK = sys.argv[1], sys.argv[2]
WINDOW = float(os.environ.get("WINDOW", "60"))
WARMUP = float(os.environ.get("WARMUP", "10"))
SCANS = int(os.environ.get("SCANS", "3"))
TOL = 0.005  # half of the 0.01 that scan prints
HZ = os.sysconf("SC_CLK_TCK")
SOCK = os.environ["TMUX_SOCK"]
MODELS, SMALL = os.path.join(WORK, "models"), os.path.join(WORK, "small")
TRUTH = json.load(open(os.path.join(WORK, "truth.json")))
COPIES = TRUTH["copies"]
started: list[subprocess.Popen] = []
TOP_NOTES: list[str] = []


def note_pid(pid: int) -> None:
    with open(os.path.join(WORK, "tool-pids"), "a") as f:
        f.write(f"{pid}\n")


def cpu(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


def status_kib(pid: int, key: str) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return float("nan")


def forks() -> int:
    for line in open("/proc/stat"):
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def truth_now() -> dict[str, float]:
    """Each model's true count now: fincore's resident fraction + the copies made."""
    paths = sorted(COPIES)
    out = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES,SIZE,FILE", *paths],
                         check=True, capture_output=True, text=True).stdout
    t = {}
    for line in out.splitlines():
        res, size, path = line.split(None, 2)
        t[path] = min(int(res), int(size)) / int(size) + COPIES[path]
    return t


def compare(counts: dict[str, tuple[float, bool]], truth: dict[str, float]) -> dict:
    """counts: path -> (count, lower bound). Files of truth missing from counts are off."""
    off, lower, worst = [], 0, 0.0
    for path, want in truth.items():
        got = counts.get(path)
        if got is None:
            off.append((path, None, want))
            continue
        lower += got[1]
        err = abs(got[0] - want)
        worst = max(worst, err)
        if err > TOL or got[1]:
            off.append((path, f"{got[0]:.4f}" + (" (lower bound)" if got[1] else ""), want))
    return {"off": off, "lower": lower, "worst": worst, "files": len(truth)}


def scan_once(paths: list[str]) -> tuple[float, float, float, dict]:
    t0 = time.perf_counter()
    p = subprocess.Popen([BIN, "scan", "--json", *paths], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    note_pid(p.pid)
    body = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"twofold scan exited {p.returncode}")
    rep = json.loads(body)
    counts = {f["path"]: (f["representations"]["proven"], f["representations"]["lower_bound"])
              for f in rep["files"]}
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, counts


def tmux(*a: str) -> None:
    subprocess.run(["tmux", "-L", SOCK, *a], check=True)


def pid_from(path: str) -> int:
    for _ in range(200):
        if os.path.exists(path) and open(path).read().strip():
            pid = int(open(path).read())
            note_pid(pid)
            return pid
        time.sleep(0.05)
    sys.exit(f"no pid in '{path}'")


def window(pids: dict[str, int], during=None) -> dict[str, tuple[float, float]]:
    """CPU % of a core and peak RSS MiB of each pid over WINDOW s."""
    c0 = {n: cpu(p) for n, p in pids.items()}
    t0 = time.monotonic()
    if during:
        during(t0 + WINDOW)
    time.sleep(max(0.0, t0 + WINDOW - time.monotonic()))
    wall = time.monotonic() - t0
    return {n: (100 * (cpu(p) - c0[n]) / wall, status_kib(p, "VmHWM") / 1024)
            for n, p in pids.items()}


def port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    n = s.getsockname()[1]
    s.close()
    return n


def scrape(p: int) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200:
        raise OSError(f"status {r.status}")
    return body


def twofold_counts(body: bytes) -> dict[str, tuple[float, bool]]:
    text = body.decode()
    path = dict(re.findall(r'^twofold_file_info\{[^}]*?file_id="([^"]+)"[^}]*?path="([^"]*)"',
                           text, re.M))
    if not path:  # labels in the other order
        path = {i: p for p, i in re.findall(
            r'^twofold_file_info\{[^}]*?path="([^"]*)"[^}]*?file_id="([^"]+)"', text, re.M)}
    val = dict(re.findall(r'^twofold_file_copies\{file_id="([^"]+)"\} (\S+)', text, re.M))
    low = dict(re.findall(r'^twofold_file_copies_lower_bound\{file_id="([^"]+)"\} (\S+)',
                          text, re.M))
    return {path[i]: (float(v), low.get(i, "0") not in ("0", "0.0")) for i, v in val.items()
            if i in path}


def row(name: str, r: tuple[float, float], peer: str | None, res: dict) -> str:
    ratio = "—"
    if peer and res.get(peer) and res[peer][0] > 0:
        ratio = f"{r[0] / res[peer][0]:.2f}x {peer}"
    return f"| {name} | {r[0]:.2f}% | {r[1]:.1f} | {ratio} |"


def phase_scan() -> list[str]:
    out = ["| scan | wall s | CPU s | peak RSS MiB | files exact | lower bound | worst error |",
           "|---|---|---|---|---|---|---|"]
    for i in range(SCANS):
        wall, cpu_s, rss, counts = scan_once([MODELS, SMALL])
        c = compare(counts, truth_now())
        out.append(f"| `scan MODELS SMALL` #{i + 1} | {wall:.2f} | {cpu_s:.2f} | {rss:.1f} | "
                   f"{c['files'] - len(c['off'])}/{c['files']} | {c['lower']} | {c['worst']:.4f} |")
        for path, got, want in c["off"][:5]:
            out.append(f"|  off: {os.path.relpath(path, WORK)} | printed {got} | truth {want:.4f} | | | | |")
    wall, cpu_s, rss, counts = scan_once([])
    truth = {p: v for p, v in truth_now().items() if p in counts}
    c = compare(counts, truth)
    out.append(f"| `scan` (no paths: the host) | {wall:.2f} | {cpu_s:.2f} | {rss:.1f} | "
               f"{c['files'] - len(c['off'])}/{c['files']} (found {c['files']} of {len(COPIES)}) | "
               f"{c['lower']} | {c['worst']:.4f} |")
    return out


def phase_top() -> list[str]:
    cfg = os.path.join(WORK, "cfg", "btop")
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, "btop.conf"), "w") as f:
        f.write('update_ms = 1000\ncolor_theme = "Default"\n')
    cmds = {
        "twofold top --interval 1s": f"exec {BIN} top --interval 1s {MODELS} {SMALL}",
        "htop -d 10": "exec htop -d 10",
        "btop (update_ms 1000)": f"XDG_CONFIG_HOME={WORK}/cfg exec btop",
    }
    pids = {}
    for i, (name, cmd) in enumerate(cmds.items()):
        pf = os.path.join(WORK, f"pid.top{i}")
        tmux("new-session", "-d", "-s", f"t{i}", "-x", "160", "-y", "48",
             f"echo $$ > {pf}; {cmd}")
        pids[name] = pid_from(pf)
    time.sleep(WARMUP)
    screens = {"all": 0, "lower": 0}

    def look(end: float) -> None:
        # twofold top's screen every 2 s: how many show a count as a lower bound (≥).
        while time.monotonic() + 2 <= end:
            t = time.monotonic()
            text = subprocess.run(["tmux", "-L", SOCK, "capture-pane", "-p", "-t", "t0"],
                                  capture_output=True, text=True).stdout
            screens["all"] += 1
            screens["lower"] += "≥" in text
            time.sleep(max(0.0, t + 2 - time.monotonic()))

    res = window(pids, look)
    for i in range(len(cmds)):
        tmux("kill-session", "-t", f"t{i}")
    TOP_NOTES.append(f"top: {screens['lower']} of {screens['all']} screens (one every 2 s) "
                     "showed a count as a lower bound (≥)")
    return [row(n, r, None if n.startswith("htop") else "htop -d 10", res)
            for n, r in res.items()]


def phase_serve() -> tuple[list[str], list[str]]:
    ports = {"twofold serve --interval 5s": port(), "node-exporter": port(),
             "process-exporter": port()}
    pe_cfg = os.path.join(WORK, "process-exporter.yml")
    with open(pe_cfg, "w") as f:
        f.write('process_names:\n  - name: "{{.Comm}}"\n    cmdline: [".+"]\n')
    p1, p2, p3 = ports.values()
    cmds = {
        "twofold serve --interval 5s": [BIN, "serve", "--listen", f"127.0.0.1:{p1}",
                                        "--interval", "5s", "--max-files", "1000",
                                        "--model-glob", f"{MODELS}/*",
                                        "--model-glob", f"{SMALL}/*"],
        "node-exporter": ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{p2}"],
        "process-exporter": ["prometheus-process-exporter", "-web.listen-address",
                             f"127.0.0.1:{p3}", "-config.path", pe_cfg],
    }
    pids = {}
    for name, cmd in cmds.items():
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(p)
        note_pid(p.pid)
        pids[name] = p.pid
    deadline = time.time() + 300 + WARMUP
    for name, p in ports.items():
        while True:
            try:
                body = scrape(p)
                if not name.startswith("twofold") or len(twofold_counts(body)) >= len(COPIES):
                    break
            except (OSError, http.client.HTTPException):
                pass
            if time.time() > deadline:
                sys.exit(f"{name} never became ready")
            time.sleep(0.5)
    time.sleep(WARMUP)
    frames: list[dict] = []

    # The truth sampled every 0.5 s through the window, so each scrape can be checked also
    # against the truth when its collection finished (serve answers from its last
    # collection, up to --interval old: where the page cache moves in between, the truth
    # at the scrape is another host).
    samples: list[tuple[float, dict[str, float]]] = []
    sampling = threading.Event()

    def sample_truth() -> None:
        while not sampling.is_set():
            samples.append((time.time(), truth_now()))
            sampling.wait(0.5)

    sampler = threading.Thread(target=sample_truth, daemon=True)
    sampler.start()
    at_collection: list[bool] = []

    def collected_exact(body: bytes) -> bool:
        m = re.search(rb"^twofold_collect_last_success_timestamp_seconds (\S+)", body, re.M)
        if not m:
            return False
        ts = float(m.group(1))
        near = [t for w, t in list(samples) if ts - 1.0 <= w <= ts + 0.5]
        counts = twofold_counts(body)
        return bool(near) and all(
            any(abs(counts[p][0] - t[p]) <= TOL for t in near if p in t) for p in COPIES
            if p in counts)

    def scrapes(end: float) -> None:
        while time.monotonic() + 5 <= end + 0.5:
            t = time.monotonic()
            for name, p in ports.items():
                body = scrape(p)
                if name.startswith("twofold"):
                    frames.append(compare(twofold_counts(body), truth_now()))
                    at_collection.append(collected_exact(body))
            time.sleep(max(0.0, t + 5 - time.monotonic()))

    res = window(pids, scrapes)
    sampling.set()
    sampler.join()
    for p in started:
        p.terminate()
    for p in started:
        p.wait()
    started.clear()
    rows = [row(n, r, None if n == "node-exporter" else "node-exporter", res)
            for n, r in res.items()]
    exact = sum(1 for f in frames if not f["off"])
    low = sum(1 for f in frames if f["lower"])
    worst = max((f["worst"] for f in frames), default=float("nan"))
    notes = [f"serve: {exact} of {len(frames)} scrapes had every file's count exact "
             f"(|error| <= {TOL}) against the truth at the scrape; {sum(at_collection)} of "
             f"{len(at_collection)} against the truth when its collection finished (sampled "
             f"every 0.5 s, within 1 s before to 0.5 s after); {low} had a lower bound; worst "
             f"error {worst:.4f}"]
    for f in frames:
        for path, got, want in f["off"][:3]:
            notes.append(f"  off: {os.path.relpath(path, WORK)} printed {got} truth {want:.4f}")
    return rows, notes


def phase_record() -> list[str]:
    p = subprocess.Popen([BIN, "record", "--store", os.path.join(WORK, "store"),
                          "--interval", "1s", MODELS, SMALL],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started.append(p)
    note_pid(p.pid)
    time.sleep(WARMUP)
    res = window({"twofold record --interval 1s": p.pid})
    p.terminate()
    p.wait()
    started.clear()
    # Each recorded snapshot's file rows: how many snapshots had a lower bound.
    out = subprocess.run([BIN, "dump", "--store", os.path.join(WORK, "store"),
                          "--format", "json"], capture_output=True, text=True).stdout
    snaps: dict[str, bool] = {}
    for line in out.splitlines():
        d = json.loads(line)["data"]
        snaps[d["at"]] = snaps.get(d["at"], False) or d["lower_bound"]
    TOP_NOTES.append(f"record: {sum(snaps.values())} of {len(snaps)} snapshots had a "
                     "count marked lower bound")
    return [row(n, r, None, res) for n, r in res.items()]


def main() -> int:
    n0, t0 = forks(), time.monotonic()
    # Pid files of an earlier run in the same work dir would name processes long gone.
    for f in os.listdir(WORK):
        if f.startswith("pid."):
            os.remove(os.path.join(WORK, f))
    try:
        scan = phase_scan()
        top = phase_top()
        serve, notes = phase_serve()
        record = phase_record()
    finally:
        for p in started:
            p.kill()
            p.wait()
        # The tmux server of the top phase, also when that phase failed half-way.
        subprocess.run(["tmux", "-L", SOCK, "kill-server"], stderr=subprocess.DEVNULL)
    rate = (forks() - n0) / (time.monotonic() - t0)
    procs = sum(1 for d in os.scandir("/proc") if d.name.isdigit())
    print(f"host: {procs} processes, {rate:.0f} new processes/s during the run; "
          f"{len(COPIES)} model files; windows {WINDOW:.0f} s after {WARMUP:.0f} s warm-up\n")
    print("\n".join(scan))
    print("\n| tool | CPU % of one core | peak RSS MiB | ratio to peer |\n|---|---|---|---|")
    print("\n".join(top + serve + record))
    print()
    print("\n".join(notes + TOP_NOTES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
