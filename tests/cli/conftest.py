"""``affinity verify`` sets AFFINITY_BUILD=pure in its own process (main()); these tests
call main() in the pytest process, so the variable is put back after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_affinity_build() -> Iterator[None]:
    before = os.environ.get("AFFINITY_BUILD")
    yield
    if before is None:
        os.environ.pop("AFFINITY_BUILD", None)
    else:
        os.environ["AFFINITY_BUILD"] = before
