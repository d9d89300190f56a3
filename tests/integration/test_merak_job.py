"""framework=merak's model on real merak-zeus engines equals the same model trained unsplit.

Two CPU ranks in the Merak environment (see test_merak_adapter.py for how) build zoo models with
``perseus.train.merak.engine.build_engine`` and train them; rank 0 trains the same model as one
``nn.Sequential`` in the same process. Equal losses show the stage cut, the tied embedding and
output head on different stages, and Merak's tuple passing (T5) change nothing.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from tests.integration._support.launch import run_ranks
from tests.integration._support.merak_env import merak_python

pytestmark = [pytest.mark.integration, pytest.mark.merak, pytest.mark.one_worker]

MODELS = [
    ("gpt3-tiny", "1f1b"),
    ("bloom-tiny", "early_recompute_1f1b"),
    ("t5-tiny", "last_no_recompute_1f1b"),
]


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_ranks(
        "tests.integration._support.merak_job_worker:main",
        {"models": MODELS},
        python=merak_python(),
        timeout_s=600,
    )


@pytest.mark.parametrize("model", [name for name, _ in MODELS])
def test_pipeline_trains_like_the_unsplit_model(ranks: List[Dict[str, Any]], model: str) -> None:
    first, last = ranks[0][model], ranks[1][model]
    assert first["losses"] == last["losses"]  # every rank reports the pipeline's loss
    assert first["losses"] == pytest.approx(first["reference"], rel=1e-5)
    assert first["losses"][-1] < first["losses"][0]  # it learns


@pytest.mark.parametrize("model", [name for name, _ in MODELS])
def test_tied_embedding_stays_tied_across_stages(ranks: List[Dict[str, Any]], model: str) -> None:
    first, last = ranks[0][model]["tied_sums"], ranks[1][model]["tied_sums"]
    assert len(first) == len(last) == 1
    assert first == pytest.approx(last, rel=1e-12)
