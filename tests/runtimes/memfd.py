"""Copies a model file into a memfd (as loaders that stage weights in shared memory do),
maps it MAP_SHARED, prints "ready" and waits for stdin to close.

    python3 memfd.py FILE
"""
import mmap
import os
import sys

data = open(sys.argv[1], "rb").read()
fd = os.memfd_create("weights")
os.write(fd, data)
view = mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
assert view[: len(data)] == data
del data
print("ready", flush=True)
sys.stdin.read()
