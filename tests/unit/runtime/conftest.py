"""Fixtures shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perseus.runtime import context


@pytest.fixture
def clean_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher config in the environment and no optimizers left over, before and after."""
    monkeypatch.delenv(context.CONFIG_ENV, raising=False)
    context.reset()
    yield
    context.reset()
