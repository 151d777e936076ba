"""Finding and running the `twofold` binary: the one implementation; Python only reads
its JSON."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from typing import List, Optional, Sequence, Tuple

#: Set to the path of a `twofold` binary to use that one instead of the installed one.
ENV_BIN = "TWOFOLD_BIN"

_ERROR = "twofold: error: "
_WARNING = "twofold: warning: "


class TwofoldError(Exception):
    """The binary failed, or could not be found or run.

    `message` is the binary's one-line error (its stderr line without the
    `twofold: error:` prefix), `exit_code` its exit status (2: bad input or an error, a
    missing privilege among them; `None` where it did not run), `stderr` all it wrote
    there.
    """

    def __init__(self, message: str, exit_code: Optional[int] = None, stderr: str = ""):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.stderr = stderr

    def __str__(self) -> str:
        return self.message


class SchemaMismatch(TwofoldError):
    """The binary's JSON is of another `schema_version` than this package reads."""


def _script_dirs() -> List[str]:
    """Where pip puts the wheel's binary: this interpreter's scripts directory (the
    virtualenv's `bin`), then the user scheme's (`pip install --user`)."""
    dirs: List[str] = []
    schemes: List[Optional[str]] = [None]
    try:
        schemes.append(sysconfig.get_preferred_scheme("user"))
    except (AttributeError, KeyError):  # Python < 3.10
        schemes.append(os.name + "_user")
    for scheme in schemes:
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if d and d not in dirs:
            dirs.append(d)
    return dirs


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def binary() -> str:
    """The path of the `twofold` binary this package runs: `$TWOFOLD_BIN` if set, else
    the one installed beside the package (the interpreter's scripts directory), else the
    first on `PATH`."""
    env = os.environ.get(ENV_BIN)
    if env:
        if not _executable(env):
            raise TwofoldError(f"{ENV_BIN}={env!r} is not an executable file")
        return env
    for d in _script_dirs():
        candidate = os.path.join(d, "twofold")
        if _executable(candidate):
            return candidate
    found = shutil.which("twofold")
    if found:
        return found
    raise TwofoldError(
        "the twofold binary was not found beside this package ("
        + ", ".join(_script_dirs())
        + ") nor on PATH: reinstall the wheel (pip install twofold) or set "
        + ENV_BIN
    )


def _error_line(stderr: str, code: int) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(_ERROR):
            return line[len(_ERROR) :]
    if lines:
        return lines[-1]
    if code < 0:
        return f"twofold was killed by signal {-code}"
    return f"twofold exited with status {code}"


def run(args: Sequence[str]) -> Tuple[str, List[str]]:
    """Runs `twofold ARGS...`: its stdout and its warnings (stderr lines without the
    `twofold: warning:` prefix). A non-zero exit raises `TwofoldError`."""
    exe = binary()
    try:
        proc = subprocess.run(
            [exe, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
        )
    except OSError as e:
        raise TwofoldError(f"cannot run {exe}: {e.strerror or e}") from e
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise TwofoldError(_error_line(stderr, proc.returncode), proc.returncode, stderr)
    warnings = [
        line[len(_WARNING) :] if line.startswith(_WARNING) else line
        for line in stderr.splitlines()
        if line.strip()
    ]
    return proc.stdout.decode("utf-8", "replace"), warnings
