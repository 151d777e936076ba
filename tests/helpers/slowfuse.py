#!/usr/bin/env python3
"""A passthrough FUSE filesystem (fusepy) whose answers can be made slow or hung.

    slowfuse.py BACKING MOUNTPOINT CONTROL [LOG]

Mirrors the regular files of BACKING (flat, read-only) at MOUNTPOINT. Before each
operation it reads CONTROL, lines of `OP SECONDS` (OP: open, read, getattr, statfs;
SECONDS: a delay, or `inf` to hang until the daemon dies), and sleeps that long
first; `read>=OFFSET SECONDS` delays only reads at OFFSET or beyond (a read that hangs
mid-file). The daemon is multithreaded: one hung operation does not stop the others.
Files are opened without FOPEN_KEEP_CACHE (fusepy's default), so the kernel drops a
file's page cache at every open, as many FUSE filesystems do. Prints `mounted` once
the mount answers. Used by tests/exact/hung.rs.
"""
import errno
import os
import sys
import threading
import time

from fuse import FUSE, FuseOSError, Operations, fuse_get_context


class Slow(Operations):
    def __init__(self, backing, control, log=None):
        self.backing = backing
        self.control = control
        self.log = open(log, "a", buffering=1) if log else None
        self.log_lock = threading.Lock()

    def _note(self, line):
        if self.log:
            with self.log_lock:
                self.log.write(line + "\n")

    def _wait(self, op, offset=None):
        try:
            with open(self.control) as f:
                lines = f.read().split("\n")
        except OSError:
            return
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and offset is not None and parts[0].startswith(op + ">="):
                if offset >= int(parts[0][len(op) + 2:]):
                    parts[0] = op
            if len(parts) == 2 and parts[0] == op:
                if parts[1] == "inf":
                    threading.Event().wait()
                time.sleep(float(parts[1]))

    def _path(self, path):
        return os.path.join(self.backing, path.lstrip("/"))

    def getattr(self, path, fh=None):
        if path != "/":
            self._wait("getattr")
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        keys = ("st_mode", "st_size", "st_uid", "st_gid", "st_nlink", "st_ino",
                "st_atime", "st_mtime", "st_ctime")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self.backing)

    def open(self, path, flags):
        self._wait("open")
        self._note("open %d %s" % (fuse_get_context()[2], path))
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._path(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        self._wait("read", offset)
        self._note("read %d %d %d" % (fuse_get_context()[2], offset, size))
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)

    def statfs(self, path):
        self._wait("statfs")
        st = os.statvfs(self.backing)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}


def main():
    backing, mountpoint, control = sys.argv[1:4]
    log = sys.argv[4] if len(sys.argv) > 4 else None

    def announce():
        # Ready when the mount answers a stat of the root.
        for _ in range(500):
            if os.path.ismount(mountpoint):
                print("mounted", flush=True)
                return
            time.sleep(0.01)
        print("not mounted", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    FUSE(Slow(backing, control, log), mountpoint, foreground=True, nothreads=False,
         ro=True, allow_other=False)


if __name__ == "__main__":
    main()
