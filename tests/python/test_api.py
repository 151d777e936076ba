"""twofold.scan / count on real NumPy loaders, against fincore(1); errors; the notebook
repr; unknown values."""

import html
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import twofold
from conftest import fincore_fraction, write_model


def test_np_load_copy_counts_two(model):
    weights = np.load(model)  # read() into a private array: a copy
    report = twofold.scan(model, pids=os.getpid())
    f = report.files[model]
    assert report.schema_version == twofold.SCHEMA_VERSION
    assert f.page_cache == fincore_fraction(model) == 1.0
    assert round(f.private_copies, 2) == 1.00
    assert round(f.count, 2) == 2.00 and not f.lower_bound, f
    assert [(c.pid, c.how) for c in f.copies] == [(os.getpid(), "read")]
    assert "proven-private-copy" in [x.code for x in f.findings]
    assert f.size_bytes == os.path.getsize(model)
    del weights


def test_np_load_mmap_counts_one(model):
    weights = np.load(model, mmap_mode="r")
    float(weights.sum())  # touch every page
    report = twofold.scan([model], pids=[os.getpid()])
    f = report.files[model]
    assert f.page_cache == fincore_fraction(model) == 1.0
    assert f.private_copies == 0.0 and f.copies == ()
    assert round(f.count, 2) == 1.00 and not f.lower_bound, f
    assert [(m.pid, m.kind) for m in f.mappers] == [(os.getpid(), "shared")]  # mmap_mode="r": MAP_SHARED
    # count() scans the whole host: nobody else holds this file's bytes.
    assert round(twofold.count(model), 2) == 1.00
    # Any name of the file finds it.
    rel = os.path.relpath(model)
    assert report.files[rel] is f
    del weights


def test_bad_path_raises_the_binary_message(tmp_path):
    missing = str(tmp_path / "missing.safetensors")
    with pytest.raises(twofold.TwofoldError) as e:
        twofold.scan(missing)
    assert e.value.exit_code == 2
    direct = subprocess.run(
        [twofold.binary(), "scan", "--json", missing], capture_output=True, text=True
    )
    assert direct.returncode == 2
    assert direct.stderr.strip().splitlines()[-1] == "twofold: error: " + e.value.message
    assert missing in e.value.message and "No such file" in e.value.message
    assert str(e.value) == e.value.message
    with pytest.raises(twofold.TwofoldError):
        twofold.count(missing)


def test_unknown_pid_raises(model):
    with pytest.raises(twofold.TwofoldError) as e:
        twofold.scan(model, pids=2**22 + 12345)
    assert e.value.exit_code == 2 and "no process with pid" in e.value.message


def test_repr_html_is_a_table_of_counts(tmp_path):
    path = write_model(tmp_path / "a<b>&c.npy", 8 << 20)
    weights = np.load(path, mmap_mode="r")
    float(weights.sum())
    report = twofold.scan(path, pids=os.getpid())
    page = report._repr_html_()
    assert page.startswith("<table") and page.endswith("</table>")
    assert html.escape(path) in page and "a<b>" not in page
    assert "<td><b>1.00</b></td>" in page
    assert f"{path}: in memory 1.00 times" in str(report)
    del weights


def test_unknown_stays_none_never_zero(model):
    doc = twofold.scan(model, pids=os.getpid()).raw
    doc = json.loads(json.dumps(doc))
    r = doc["files"][0]["representations"]
    r.update(page_cache=None, cow=None, proven=None, device=None, lower_bound=True)
    doc["files"][0]["resident_bytes"] = None
    f = twofold.parse(doc).files[model]
    assert (f.count, f.page_cache, f.cow, f.device, f.resident_bytes) == (None,) * 5
    assert f.count_text() == "unknown"
    assert "<td><b>unknown</b></td>" in twofold.parse(doc)._repr_html_()
    # No NVIDIA driver here: device copies are not known, not 0.
    real = twofold.scan(model, pids=os.getpid())
    if real.raw["gpus"].get("gpus") in (None, []):
        assert real.files[model].device is None


def test_schema_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(twofold.SchemaMismatch) as e:
        twofold.parse({"schema_version": 99, "files": []})
    assert "schema_version 99" in e.value.message and "reads schema_version 1" in e.value.message
    fake = tmp_path / "twofold"
    fake.write_text('#!/bin/sh\necho \'{"schema_version": 2, "files": []}\'\n')
    fake.chmod(0o755)
    monkeypatch.setenv(twofold.ENV_BIN, str(fake))
    assert twofold.binary() == str(fake)
    with pytest.raises(twofold.SchemaMismatch, match="wrote JSON schema_version 2"):
        twofold.scan()


def test_the_binary_is_the_one_installed_beside_the_package():
    beside = os.path.join(sysconfig.get_path("scripts"), "twofold")
    assert twofold.binary() == beside
    assert shutil.which("twofold") == beside  # on PATH in the virtualenv
    version = subprocess.run(
        [sys.executable, "-m", "twofold", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("twofold ")


def test_reports_are_typed_dataclasses(model):
    import dataclasses

    report = twofold.scan(model, pids=os.getpid())
    for cls in (twofold.Report, twofold.FileReport, twofold.Finding, twofold.Copy):
        assert dataclasses.is_dataclass(cls)
    assert all(isinstance(p, twofold.Process) for p in report.processes)
    assert [p.pid for p in report.processes] == [os.getpid()]
    assert report.privilege is None or isinstance(report.privilege, twofold.Privilege)


def test_trace_uploads_and_exact_reach_the_binary(model):
    weights = np.load(model, mmap_mode="r")
    float(weights.sum())
    report = twofold.scan(model, pids=os.getpid(), exact=True, trace_uploads=0.2)
    assert round(report.files[model].count, 2) == 1.00
    if os.geteuid() == 0:  # else: a warning that tracing needs root, and the plain scan
        assert any("tracing for 0.2 s" in w for w in report.warnings), report.warnings
    del weights
