from __future__ import annotations

from typing import Iterator

import pytest

from perseus.runtime import context
from tests.integration._support.recording import HookLog


@pytest.fixture
def hook_log() -> Iterator[HookLog]:
    """Route every adapter's hooks to recording objects (one per (stage, key))."""
    context.reset()
    log = HookLog()
    context.configure(factory=log)
    yield log
    context.reset()
