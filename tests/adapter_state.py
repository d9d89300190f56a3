"""A fixture shared by the adapter tests of both tiers: every framework's patch state restored."""

from __future__ import annotations

from typing import Iterator

import perseus.adapters as adapters
import pytest


@pytest.fixture(autouse=True)
def _restore_patch_state() -> Iterator[None]:
    """Leave every framework patched or not, as the test found it (other tests import them)."""
    found = {name: adapters.is_patched(name) for name in adapters.available()}
    yield
    for name, was_patched in found.items():
        if was_patched:
            adapters.patch(name)
        else:
            adapters.unpatch(name)
