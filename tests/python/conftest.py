"""Fixtures of the wheel's tests (run by scripts/python-tests.sh, inside a fresh
virtualenv where the wheel is installed): model files of unique bytes, made resident by
another process, and fincore(1) as the page cache's ground truth."""

import os
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

MIB = 1 << 20
# Above glibc's largest mmap threshold (32 MiB): NumPy's array of the file is its own
# mapping, returned to the kernel when freed, never a stale copy left in the heap.
SIZE = 40 * MIB

_WRITE = """
import sys, numpy as np
n = int(sys.argv[2]) // 4
np.save(sys.argv[1], np.random.default_rng().standard_normal(n, dtype=np.float32))
"""


def write_model(path, size=SIZE):
    """A `.npy` of random float32 written by a child process (so this process never holds
    its bytes), then read whole by `cat` (resident in the page cache, no copy here)."""
    subprocess.run([sys.executable, "-c", _WRITE, str(path), str(size)], check=True)
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return str(path)


def fincore_fraction(path):
    """The page-cache resident fraction of `path` by fincore(1): resident pages over the
    file's pages."""
    out = subprocess.run(
        ["fincore", "--noheadings", "--output", "PAGES", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-os.path.getsize(path) // page)
    return int(out.split()[0]) / pages


@pytest.fixture
def model(tmp_path):
    """A resident model file of its own bytes (no other test's copy is a copy of it)."""
    path = write_model(tmp_path / "model.npy")
    assert fincore_fraction(path) == 1.0, "the file should be wholly in the page cache"
    return path
