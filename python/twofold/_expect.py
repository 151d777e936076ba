"""`twofold.expect`: a test helper that fails when this process (and the children it left
running) holds more representations of a model file than allowed."""

from __future__ import annotations

import glob
import os
from types import TracebackType
from typing import List, Literal, Optional, Type, Union

from ._binary import TwofoldError
from ._report import FileReport, Report


def _children(pid: int) -> List[int]:
    out: List[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # the task or the process is gone
    return out


def own_pids() -> List[int]:
    """This process and its descendants still running (`/proc/*/task/*/children`,
    followed recursively)."""
    seen: List[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(_children(pid))
    return seen


def _why(f: FileReport) -> str:
    """The parts of the count and the binary's words on each copy."""
    parts = [
        "page cache " + ("unknown" if f.page_cache is None else f"{f.page_cache:.2f}"),
        "copy-on-write " + ("unknown" if f.cow is None else f"{f.cow:.2f}"),
        f"private copies {f.private_copies:.2f}",
        "device " + ("unknown" if f.device is None else f"{f.device:.2f}"),
    ]
    lines = ["  " + " + ".join(parts)]
    for finding in f.findings:
        lines.append(f"  - {finding.message}")
        if finding.remedy:
            lines.append(f"    remedy: {finding.remedy}")
    if not f.findings:
        for c in f.copies:
            lines.append(
                f"  - pid {c.pid} ({c.comm}) holds a private copy ({c.how}): "
                f"{c.fraction:.2f} of the file"
            )
    return "\n".join(lines)


class expect:
    """Asserts, when the `with` block exits, that this process and the children it left
    running hold `path` in memory at most `at_most` times (page cache + private copies
    + copy-on-write pages + device copies where known; compared at the two decimals
    the binary prints):

        with twofold.expect("model.safetensors", at_most=1.0):
            model = load_my_model()

    The measurement runs at `__exit__`, so what the block loaded must still be
    referenced then (as `model` above is): a copy freed inside the block is not seen.
    A count over `at_most` raises `AssertionError` naming each copy, how it was made
    and the remedy, in the binary's words; a count that is only a lower bound (a
    candidate could not be searched) raises it too, since "at most" is then not
    proven. A count the binary cannot know here raises `TwofoldError`. After the
    block, `.report`, `.file` and `.count` hold what was measured.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        at_most: float = 1.0,
        *,
        exact: bool = False,
        children: bool = True,
    ):
        self.path = os.fsdecode(path)
        self.at_most = float(at_most)
        self.exact = exact
        self.children = children
        self.report: Optional[Report] = None
        self.file: Optional[FileReport] = None
        self.count: Optional[float] = None

    def __enter__(self) -> "expect":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Literal[False]:
        if exc_type is None:
            self.check()
        return False

    def check(self) -> FileReport:
        """Measures now and asserts; what `__exit__` runs."""
        from . import scan  # the package's, so that tests can stand in for it

        pids = own_pids() if self.children else [os.getpid()]
        self.report = scan([self.path], pids=pids, exact=self.exact)
        try:
            f = self.report.files[self.path]
        except KeyError:
            raise TwofoldError(f"'{self.path}' is not in the scan's model files") from None
        self.file, self.count = f, f.count
        who = f"pid {pids[0]}" + (f" and its children {pids[1:]}" if pids[1:] else "")
        if f.count is None:
            raise TwofoldError(
                f"twofold.expect: how many times '{f.path}' is in memory is not known here: "
                f"{f.residency_unknown_reason or 'its page-cache residency could not be read'}"
            )
        if round(f.count, 2) > self.at_most:
            raise AssertionError(
                f"twofold.expect: '{f.path}' is in memory {f.count_text()} times ({who}), "
                f"more than at_most={self.at_most!r}:\n{_why(f)}"
            )
        if f.lower_bound:
            raise AssertionError(
                f"twofold.expect: '{f.path}' is in memory {f.count_text()} times ({who}): "
                f"only a lower bound (a process that could hold a copy was not searched, "
                f"or a part of the count is unknown), "
                f"so at most {self.at_most!r} is not proven:\n{_why(f)}"
            )
        return f
