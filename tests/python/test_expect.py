"""twofold.expect and the pytest plugin's `twofold` fixture."""

import os
import subprocess
import sys

import numpy as np
import pytest

import twofold

_HOLD = """
import sys, numpy as np
weights = np.load(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
"""


def test_expect_fails_on_a_copy(model):
    with pytest.raises(AssertionError) as e:
        with twofold.expect(model, at_most=1.0):
            weights = np.load(model)
    text = str(e.value)
    assert f"'{model}' is in memory 2.00 times (pid {os.getpid()})" in text, text
    assert "more than at_most=1.0:" in text
    assert f"pid {os.getpid()} (" in text and "private copy" in text and "read()" in text
    assert "remedy: load it with mmap" in text
    del weights


def test_expect_passes_on_a_mapping(model):
    with twofold.expect(model, at_most=1.0) as e:
        weights = np.load(model, mmap_mode="r")
        float(weights.sum())
    assert round(e.count, 2) == 1.00 and e.file.mappers
    # A copy is allowed where the bound allows it.
    with twofold.expect(model, at_most=2.0) as e:
        copy = np.load(model)
    assert round(e.count, 2) == 2.00
    del weights, copy


def test_expect_sees_the_children_left_running(model):
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, model], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline() == b"ready\n"
        assert child.pid in twofold.own_pids()
        with pytest.raises(AssertionError) as e:
            with twofold.expect(model, at_most=1.0):
                pass
        assert f"pid {child.pid} (" in str(e.value), str(e.value)
        with twofold.expect(model, at_most=1.0, children=False):
            pass
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_expect_cannot_pass_what_it_cannot_measure(model, monkeypatch):
    real = twofold.scan

    def unknown(*args, **kwargs):
        report = real(*args, **kwargs)
        doc = dict(report.raw)
        f = dict(doc["files"][0])
        f["representations"] = dict(f["representations"], page_cache=None, proven=None)
        f["residency_unknown_reason"] = "cachestat and mincore refused"
        doc["files"] = [f]
        return twofold.parse(doc)

    monkeypatch.setattr(twofold, "scan", unknown)
    with pytest.raises(twofold.TwofoldError, match="cachestat and mincore refused"):
        with twofold.expect(model):
            pass


def test_the_pytest_plugin_catches_a_copying_loader(pytester, model):
    # A user's test file, no conftest: the `twofold` fixture comes from the wheel's
    # pytest11 entry point. The mapping loader runs first: a failed test's traceback
    # keeps its locals (the copy) alive after it.
    pytester.makepyfile(
        test_loader=f"""
        import numpy as np

        MODEL = {model!r}

        def test_mapping_loader(twofold):
            with twofold.expect(MODEL, at_most=1.0):
                weights = np.load(MODEL, mmap_mode="r")
                float(weights.sum())

        def test_copying_loader(twofold):
            with twofold.expect(MODEL, at_most=1.0):
                weights = np.load(MODEL)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_copying_loader*",
            f"*AssertionError: twofold.expect: '{model}' is in memory 2.00 times*",
            "*holds a private copy of 'model.npy' copied with read()*",
        ]
    )
    # The entry point is the plugin's only source: without it, no fixture.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:twofold")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*fixture 'twofold' not found*"])
