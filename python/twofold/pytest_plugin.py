"""The pytest plugin (registered through the wheel's `pytest11` entry point): a `twofold`
fixture for users' tests.

    def test_loader_maps_the_model(twofold):
        with twofold.expect("model.safetensors", at_most=1.0):
            model = load_my_model()      # still referenced when the block exits
"""

from __future__ import annotations

import os
from typing import Optional, Union

import pytest

from . import Paths, Pids, Report, count, expect, scan


class Twofold:
    """What the `twofold` fixture gives: `expect`, `scan` and `count` of the package."""

    def expect(
        self,
        path: Union[str, "os.PathLike[str]"],
        at_most: float = 1.0,
        *,
        exact: bool = False,
        children: bool = True,
    ) -> expect:
        """`twofold.expect`: asserts at the block's exit that this process (and the
        children it left running) holds `path` in memory at most `at_most` times."""
        return expect(path, at_most, exact=exact, children=children)

    def scan(
        self,
        paths: Optional[Paths] = None,
        pids: Optional[Pids] = None,
        exact: bool = False,
        trace_uploads: Optional[Union[float, str]] = None,
    ) -> Report:
        """`twofold.scan`."""
        return scan(paths, pids, exact, trace_uploads)

    def count(self, path: Union[str, "os.PathLike[str]"]) -> Optional[float]:
        """`twofold.count`."""
        return count(path)


@pytest.fixture
def twofold() -> Twofold:
    """twofold's test helper: `twofold.expect(path, at_most=1.0)` as a context manager
    fails the test when the code in the block leaves more copies of the model file in
    memory than allowed."""
    return Twofold()
