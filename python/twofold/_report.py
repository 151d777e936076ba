"""Typed views of `twofold scan --json`. Nothing is computed here: every number is the
binary's, read as it wrote it; a JSON `null` (not known: a missing capability, no NVIDIA
driver, an unreadable process) stays `None`, never 0."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from ._binary import SchemaMismatch

#: The `schema_version` of the JSON document this package reads.
SCHEMA_VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Finding:
    """A finding of the scan, in the binary's words."""

    severity: str
    code: str
    subject: str
    message: str
    remedy: Optional[str]

    def __str__(self) -> str:
        return self.message + (f" (remedy: {self.remedy})" if self.remedy else "")


@dataclass(frozen=True)
class Holder:
    """A process holding the file open (`mapped`: it also maps it)."""

    pid: int
    comm: str
    fds: Tuple[int, ...]
    mapped: bool


@dataclass(frozen=True)
class Mapper:
    """One process's mappings of the file (`kind`: shared, private or mixed)."""

    pid: int
    comm: str
    kind: str
    prot: str
    mapped_bytes: int
    resident_bytes: Optional[int]
    cow_anon_bytes: Optional[int]


@dataclass(frozen=True)
class Copy:
    """A private copy proven byte by byte in a process's memory; `how` is how it was
    made (`read`, `copied_from_mapping`, `converted`, `copied`, `shared_memory`,
    `pinned`), `fraction` its part of the count."""

    pid: int
    comm: str
    how: str
    fraction: float
    memory_bytes: int
    identical_bytes: int
    converted_bytes: int
    mapped: bool


@dataclass(frozen=True)
class SuspectedCopy:
    """Private memory that could hold a copy but was not (fully) searched: beside the
    count, never in it."""

    pid: int
    comm: str
    fraction: float
    attributed_bytes: int
    why: Any
    unsearched: Any


@dataclass(frozen=True)
class Process:
    """A process of the scan (`None`: not known, e.g. `unreadable` is `denied`)."""

    pid: int
    comm: str
    cmdline: str
    rss_bytes: Optional[int]
    anon_bytes: Optional[int]
    file_bytes: Optional[int]
    pss_bytes: Optional[int]
    uss_bytes: Optional[int]
    gpu_memory_bytes: Optional[int]
    unreadable: Optional[str]


@dataclass(frozen=True)
class Privilege:
    """Who read the sample."""

    euid: int
    cap_sys_ptrace: bool


@dataclass(frozen=True)
class FileReport:
    """One model file: how many times its bytes are in memory, and its parts.

    `count` is the representation count (page cache + copy-on-write pages + proven
    private copies + device copies where known); `None` where the page cache part is not
    known. With `lower_bound` it is "at least" (a candidate was not searched, or a part
    is unknown). `page_cache`, `cow` and `device` are `None` where not known.
    """

    path: str
    size_bytes: Optional[int]
    resident_bytes: Optional[int]
    count: Optional[float]
    page_cache: Optional[float]
    cow: Optional[float]
    private_copies: float
    device: Optional[float]
    suspected: float
    lower_bound: bool
    holders: Tuple[Holder, ...]
    mappers: Tuple[Mapper, ...]
    copies: Tuple[Copy, ...]
    suspected_copies: Tuple[SuspectedCopy, ...]
    findings: Tuple[Finding, ...]
    residency_unknown_reason: Optional[str]
    key: Tuple[int, int, int] = field(repr=False)
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    def count_text(self) -> str:
        """The count as the binary prints it: `2.00`, `≥ 2.00`, or `unknown`."""
        if self.count is None:
            return "unknown"
        return ("≥ " if self.lower_bound else "") + f"{self.count:.2f}"


class FileMap(Mapping[str, FileReport]):
    """`Report.files`: by the path the binary wrote; a relative path, a symlink or any
    other name of the same inode finds the same file."""

    def __init__(self, files: Sequence[FileReport]):
        self._by_path: Dict[str, FileReport] = {f.path: f for f in files}
        self._by_key: Dict[Tuple[int, int, int], FileReport] = {f.key: f for f in files}

    def __getitem__(self, path: PathLike) -> FileReport:
        name = os.fspath(path)
        for candidate in (name, os.path.abspath(name), os.path.realpath(name)):
            if candidate in self._by_path:
                return self._by_path[candidate]
        try:
            st = os.stat(name)
        except OSError:
            raise KeyError(name) from None
        key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        if key in self._by_key:
            return self._by_key[key]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_path)

    def __len__(self) -> int:
        return len(self._by_path)

    def __repr__(self) -> str:
        return f"FileMap({list(self._by_path.values())!r})"


def _finding(f: Mapping[str, Any]) -> Finding:
    return Finding(f["severity"], f["code"], f["subject"], f["message"], f.get("remedy"))


def _file(f: Mapping[str, Any], findings: Sequence[Finding]) -> FileReport:
    r = f["representations"]
    path = f["path"]
    key = f["key"]
    return FileReport(
        path=path,
        size_bytes=f.get("size_bytes"),
        resident_bytes=f.get("resident_bytes"),
        count=r.get("proven"),
        page_cache=r.get("page_cache"),
        cow=r.get("cow"),
        private_copies=r["private_copies"],
        device=r.get("device"),
        suspected=r.get("suspected", 0.0),
        lower_bound=bool(r["lower_bound"]),
        holders=tuple(
            Holder(h["pid"], h["comm"], tuple(h.get("fds", ())), h["mapped"])
            for h in f.get("holders", ())
        ),
        mappers=tuple(
            Mapper(
                m["pid"],
                m["comm"],
                m["kind"],
                m.get("prot", ""),
                m["mapped_bytes"],
                m.get("resident_bytes"),
                m.get("cow_anon_bytes"),
            )
            for m in f.get("mappers", ())
        ),
        copies=tuple(
            Copy(
                c["pid"],
                c["comm"],
                c["how"],
                c["fraction"],
                c["memory_bytes"],
                c["identical_bytes"],
                c.get("converted_bytes", 0),
                c["mapped"],
            )
            for c in f.get("proven_copies", ())
        ),
        suspected_copies=tuple(
            SuspectedCopy(
                s["pid"],
                s["comm"],
                s["fraction"],
                s["attributed_bytes"],
                s.get("why"),
                s.get("unsearched"),
            )
            for s in f.get("suspected_copies", ())
        ),
        findings=tuple(x for x in findings if x.subject == path),
        residency_unknown_reason=f.get("residency_unknown_reason"),
        key=(key["major"], key["minor"], key["inode"]),
        raw=f,
    )


def _process(p: Mapping[str, Any]) -> Process:
    return Process(
        pid=p["pid"],
        comm=p["comm"],
        cmdline=p.get("cmdline", ""),
        rss_bytes=p.get("rss_bytes"),
        anon_bytes=p.get("anon_bytes"),
        file_bytes=p.get("file_bytes"),
        pss_bytes=p.get("pss_bytes"),
        uss_bytes=p.get("uss_bytes"),
        gpu_memory_bytes=p.get("gpu_memory_bytes"),
        unreadable=p.get("unreadable"),
    )


@dataclass(frozen=True)
class Report:
    """`twofold scan --json`, typed. `files` maps each model file's path to its
    `FileReport`; `warnings` are the binary's stderr warnings (a process it could not
    read, a missing privilege); `raw` is the whole JSON document."""

    schema_version: int
    files: FileMap
    findings: Tuple[Finding, ...]
    processes: Tuple[Process, ...]
    privilege: Optional[Privilege]
    warnings: Tuple[str, ...]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    def __str__(self) -> str:
        lines = [f"{f.path}: in memory {f.count_text()} times" for f in self.files.values()]
        return "\n".join(lines) if lines else "no model files"

    def _repr_html_(self) -> str:
        """The count per file, as a small table (Jupyter shows it)."""

        def cell(v: Optional[float]) -> str:
            return "unknown" if v is None else f"{v:.2f}"

        rows = []
        for f in self.files.values():
            rows.append(
                "<tr>"
                f"<td style=\"text-align:left\">{html.escape(f.path)}</td>"
                f"<td><b>{html.escape(f.count_text())}</b></td>"
                f"<td>{cell(f.page_cache)}</td>"
                f"<td>{cell(f.private_copies)}</td>"
                f"<td>{cell(f.device)}</td>"
                "</tr>"
            )
        if not rows:
            rows.append('<tr><td colspan="5">no model files</td></tr>')
        return (
            '<table class="twofold">'
            "<thead><tr><th>file</th><th>count</th><th>page cache</th>"
            "<th>private copies</th><th>device</th></tr></thead>"
            "<tbody>" + "".join(rows) + "</tbody></table>"
        )


def parse(doc: Mapping[str, Any], warnings: Sequence[str] = (), source: str = "twofold") -> Report:
    """A `Report` from the binary's JSON document (a dict); `SchemaMismatch` when it is of
    another `schema_version` than this package reads."""
    version = doc.get("schema_version") if isinstance(doc, Mapping) else None
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"{source} wrote JSON schema_version {version}, this Python package reads "
            f"schema_version {SCHEMA_VERSION}: install the twofold wheel whole (its binary "
            f"and its package together) or point TWOFOLD_BIN at a matching binary"
        )
    try:
        findings = [_finding(f) for f in doc.get("findings", ())]
        files = [_file(f, findings) for f in doc["files"]]
        processes = tuple(_process(p) for p in doc.get("processes", ()))
        priv = doc.get("privilege")
        privilege = Privilege(priv["euid"], priv["cap_sys_ptrace"]) if priv else None
    except (KeyError, TypeError) as e:
        raise SchemaMismatch(
            f"{source} wrote JSON that schema_version {SCHEMA_VERSION} does not describe "
            f"({type(e).__name__}: {e})"
        ) from e
    return Report(
        schema_version=version,
        files=FileMap(files),
        findings=tuple(findings),
        processes=processes,
        privilege=privilege,
        warnings=tuple(warnings),
        raw=doc,
    )

