#!/usr/bin/env python3
"""Start `twofold __child` readers and keep them alive until told to stop.

Usage:
  spawn_readers.py --twofold BIN --file F --map N --anon M [--anon-bytes 1M]
                   --ready-file PATH [--pid-file PATH]

Starts N `BIN __child map F` and M `BIN __child anon --bytes SIZE` processes with
stdin/stdout as pipes, waits until every one has printed `ready`, writes their pids
(one a line) to --pid-file, then writes the count to --ready-file (atomically, so a
poller never sees a partial file) and waits.

It stops -- closing every child's stdin (EOF makes a reader exit), then killing and
reaping any that linger -- on SIGTERM, SIGINT or SIGHUP, or when its parent (the bench
script) goes away. The children also die with this process (they set
PR_SET_PDEATHSIG=SIGKILL), so nothing outlives the benchmark.
"""

import argparse
import os
import resource
import select
import signal
import subprocess
import sys
import time

stop = False


def on_signal(signum, _frame):
    global stop
    stop = True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--twofold", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--map", type=int, default=0)
    ap.add_argument("--anon", type=int, default=0)
    ap.add_argument("--anon-bytes", default="1M")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--pid-file")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    # One pipe a child stays open (stdin); stdout pipes are closed once `ready` is read.
    # Raise the fd limit so several hundred children do not run into the soft limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * (args.map + args.anon) + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))

    parent = os.getppid()
    children: list[subprocess.Popen] = []

    def cleanup() -> None:
        for c in children:
            try:
                if c.stdin:
                    c.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for c in children:
            left = max(0.0, deadline - time.monotonic())
            try:
                c.wait(timeout=left)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()

    try:
        specs = [["map", args.file]] * args.map + [
            ["anon", "--bytes", args.anon_bytes]
        ] * args.anon
        for spec in specs:
            if stop:
                return 1
            children.append(
                subprocess.Popen(
                    [args.twofold, "__child", *spec],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    close_fds=True,
                )
            )

        # Wait for one `ready` line from every child.
        pending = {c.stdout.fileno(): c for c in children}
        bufs = {fd: b"" for fd in pending}
        deadline = time.monotonic() + args.timeout
        while pending and not stop:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"spawn_readers: {len(pending)} readers not ready after "
                      f"{args.timeout}s", file=sys.stderr)
                return 1
            r, _, _ = select.select(list(pending), [], [], min(left, 1.0))
            for fd in r:
                chunk = os.read(fd, 64)
                c = pending[fd]
                if not chunk:
                    print(f"spawn_readers: reader pid {c.pid} exited before ready "
                          f"(rc={c.poll()})", file=sys.stderr)
                    return 1
                bufs[fd] += chunk
                if b"\n" in bufs[fd]:
                    if bufs[fd].split(b"\n", 1)[0].strip() != b"ready":
                        print(f"spawn_readers: reader pid {c.pid} said {bufs[fd]!r}",
                              file=sys.stderr)
                        return 1
                    c.stdout.close()
                    del pending[fd]
        if stop:
            return 1

        if args.pid_file:
            with open(args.pid_file, "w") as f:
                f.write("".join(f"{c.pid}\n" for c in children))
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{len(children)}\n")
        os.rename(tmp, args.ready_file)

        # Keep them alive until signalled or orphaned.
        while not stop and os.getppid() == parent:
            time.sleep(0.2)
        return 0
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
