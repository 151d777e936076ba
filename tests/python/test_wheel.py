"""What the wheel carries: the binary as a script, the package with py.typed, the pytest
entry point, the license."""

import configparser
import glob
import os
import stat
import zipfile

import pytest


@pytest.fixture
def wheel():
    path = os.environ.get("TWOFOLD_WHEEL")
    if not path:
        pytest.skip("TWOFOLD_WHEEL is not set (scripts/python-tests.sh sets it)")
    with zipfile.ZipFile(path) as z:
        yield z


def test_the_wheel_carries_binary_package_entry_point_and_license(wheel):
    names = wheel.namelist()
    data = [n for n in names if n.endswith(".data/scripts/twofold")]
    assert len(data) == 1, names
    mode = wheel.getinfo(data[0]).external_attr >> 16
    assert mode & stat.S_IXUSR, oct(mode)
    for module in ("__init__.py", "_binary.py", "_report.py", "_expect.py", "pytest_plugin.py", "py.typed"):
        assert f"twofold/{module}" in names, names
    info = data[0].split(".data/")[0] + ".dist-info/"
    entry = configparser.ConfigParser()
    entry.read_string(wheel.read(info + "entry_points.txt").decode())
    assert entry["pytest11"]["twofold"] == "twofold.pytest_plugin"
    meta = wheel.read(info + "METADATA").decode()
    assert "License-Expression: MIT OR Apache-2.0" in meta, meta
    # Every license file of the repository travels in the wheel.
    repo = os.environ["TWOFOLD_REPO"]
    for lic in glob.glob(os.path.join(repo, "LICENSE*")) + glob.glob(os.path.join(repo, "COPYING*")):
        assert info + "licenses/" + os.path.basename(lic) in names, names
    # Stripped: the binary's debug info stays out of the wheel.
    assert wheel.getinfo(data[0]).file_size < 40 << 20
