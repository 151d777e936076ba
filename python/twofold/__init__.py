"""How many times is my model in memory, and why?

A thin Python API over the `twofold` binary installed with this package: every number
comes from `twofold scan --json` (the one implementation), typed here. docs/python.md.

    >>> import twofold
    >>> twofold.count("model.safetensors")   # 2.0: page cache + a private copy
    >>> report = twofold.scan(["model.safetensors"])
    >>> report.files["model.safetensors"].findings

    with twofold.expect("model.safetensors", at_most=1.0):
        model = load_my_model()           # fails if the loader copied the file
"""

from __future__ import annotations

import json
import os
from typing import Iterable, List, Optional, Union

from ._binary import ENV_BIN, SchemaMismatch, TwofoldError, binary, run
from ._expect import expect, own_pids
from ._report import (
    SCHEMA_VERSION,
    Copy,
    FileMap,
    FileReport,
    Finding,
    Holder,
    Mapper,
    Privilege,
    Process,
    Report,
    SuspectedCopy,
    parse,
)

__all__ = [
    "ENV_BIN",
    "SCHEMA_VERSION",
    "Copy",
    "FileMap",
    "FileReport",
    "Finding",
    "Holder",
    "Mapper",
    "Privilege",
    "Process",
    "Report",
    "SchemaMismatch",
    "SuspectedCopy",
    "TwofoldError",
    "binary",
    "count",
    "expect",
    "own_pids",
    "parse",
    "scan",
]

Paths = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]
Pids = Union[int, Iterable[int]]


def _paths(paths: Optional[Paths]) -> List[str]:
    if paths is None:
        return []
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    return [os.fsdecode(p) for p in paths]


def _pids(pids: Optional[Pids]) -> List[int]:
    if pids is None:
        return []
    if isinstance(pids, int):
        return [pids]
    return [int(p) for p in pids]


def _duration(d: Union[float, str]) -> str:
    if isinstance(d, str):
        return d
    text = f"{float(d):.6f}".rstrip("0").rstrip(".")
    return text + "s"


def scan(
    paths: Optional[Paths] = None,
    pids: Optional[Pids] = None,
    exact: bool = False,
    trace_uploads: Optional[Union[float, str]] = None,
) -> Report:
    """Runs `twofold scan --json` and returns its report.

    paths: model files or directories (none: every model file on the host); pids: only
    these processes (`--pid`, repeated); exact: compare every page of every copy found;
    trace_uploads: trace uploads to GPUs for this long first (seconds, or a duration such
    as "10s"; needs root or CAP_BPF + CAP_PERFMON). Raises `TwofoldError` with the
    binary's message when it fails (exit status 2: a missing path, an unknown pid, ...).
    """
    args = ["scan", "--json"]
    for pid in _pids(pids):
        args += ["--pid", str(pid)]
    if exact:
        args.append("--exact")
    if trace_uploads is not None:
        args += ["--trace-uploads", _duration(trace_uploads)]
    names = _paths(paths)
    if names:
        args.append("--")
        args += names
    out, warnings = run(args)
    try:
        doc = json.loads(out)
    except ValueError as e:
        raise TwofoldError(f"twofold scan --json wrote no JSON document ({e})") from e
    return parse(doc, warnings, source=binary())


def count(path: Union[str, "os.PathLike[str]"]) -> Optional[float]:
    """How many times the bytes of `path` are in memory (page cache + private copies +
    copy-on-write pages + device copies where known), over every process on the host;
    `None` where it is not known (the page cache's residency could not be read)."""
    report = scan([path])
    try:
        return report.files[path].count
    except KeyError:
        raise TwofoldError(f"'{os.fsdecode(path)}' is not in the scan's model files") from None
