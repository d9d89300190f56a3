"""The Merak adapter against a real Merak (skipped where Merak is not importable).

Merak pins Python 3.9 and torch 1.10 and is not on PyPI, so CI tests the adapter against a
stand-in (tests/unit/adapters/test_merak_standin.py). To run this module against the real engine:
check out github.com/ml-energy/merak-zeus outside this repository, use Python 3.9 with
torch 1.10.1 and Merak's requirements, install Perseus into that environment, then
``PYTHONPATH=/path/to/merak-zeus python -m pytest tests/integration/test_merak_adapter.py``.

The real engine's ``_exec_schedule`` runs Merak's own schedules; the instruction bodies are
replaced by recorders before the adapter wraps them (a full Merak launch needs GPUs and its
Hugging Face stack), so what is checked is Merak's dispatch through ``_INSTRUCTION_MAP`` as the
adapter sees it.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Iterator, List

import pytest
from perseus.adapters._instruction_map import ACTIVE_HOOKS

from perseus.schedule import stage_order
from tests.integration._support.recording import RecordingHooks

pytestmark = [pytest.mark.integration, pytest.mark.merak]

pipe_engine = pytest.importorskip("Merak.runtime.pipe_engine")
schedule = importlib.import_module("Merak.runtime.schedule")


class _NullHooks:
    def on_step_begin(self) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(self, name: str) -> None:
        pass

    def on_instruction_end(self, name: str) -> None:
        pass


@pytest.fixture
def recorded_engine() -> Iterator[Any]:
    """The real PipelineEngine class with do-nothing instruction bodies, then patched."""
    adapter = importlib.import_module("perseus.adapters.merak")
    adapter.unpatch()
    cls = pipe_engine.PipelineEngine
    originals: Dict[Any, Any] = dict(cls._INSTRUCTION_MAP)
    for instruction in originals:
        cls._INSTRUCTION_MAP[instruction] = lambda self, **kwargs: None
    adapter.patch()
    try:
        yield cls
    finally:
        adapter.unpatch()
        cls._INSTRUCTION_MAP.update(originals)
        adapter.patch()


def _bare_engine(cls: type, hooks: Any) -> Any:
    engine = object.__new__(cls)  # no torch.distributed: only what _exec_schedule reads
    state = vars(engine)
    state.update(
        is_profiling=False,
        fwd_outputs=[],
        pipe_buffers={},
        num_pipe_buffers=0,
        pipeline_frequency_optimizer=_NullHooks(),
        _reserve_pipe_buffers=lambda num_buffers: None,
    )
    state[ACTIVE_HOOKS] = hooks
    return engine


def test_import_patches_and_unpatch_restores() -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    cls = pipe_engine.PipelineEngine
    adapter.unpatch()
    originals = dict(cls._INSTRUCTION_MAP)
    adapter.patch()
    assert adapter.is_patched()
    assert cls._INSTRUCTION_MAP[schedule.ForwardPass] is not originals[schedule.ForwardPass]
    assert getattr(cls._INSTRUCTION_MAP[schedule.BackwardPass], "__perseus_wrapped__", False)
    adapter.unpatch()
    assert all(cls._INSTRUCTION_MAP[k] is v for k, v in originals.items())
    adapter.patch()


# Merak's 1F1B schedules: DeepSpeed's, merged P2P, and the two with activation recomputation
# (PreCheckpointForwardPass / RecomputeRecvGrad). full_critical_path_1f1b reorders
# instructions: it is not 1F1B, so it is not checked against that order.
ONE_F_ONE_B_SCHEDULES = [
    "TrainSchedule",
    "MergeP2PTrainSchedule",
    "PreRecomputeTrainSchedule",
    "LastNoRecomputeTrainSchedule",
]


@pytest.mark.parametrize("schedule_name", ONE_F_ONE_B_SCHEDULES)
@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (2, 4), (4, 6)])
def test_train_schedule_dispatch_is_1f1b(
    recorded_engine: Any, stages: int, micro_batches: int, schedule_name: str
) -> None:
    from perseus.runtime.types import RankInfo

    schedule_class = getattr(schedule, schedule_name)
    for stage in range(stages):
        hooks = RecordingHooks(RankInfo(stage=stage, num_stages=stages))
        engine = _bare_engine(recorded_engine, hooks)
        hooks.on_step_begin()
        engine._exec_schedule(
            schedule_class(micro_batches=micro_batches, stages=stages, stage_id=stage)
        )
        hooks.on_step_end()
        assert hooks.errors == []
        expected: List[str] = [n for n, _ in stage_order("1f1b", stages, micro_batches)[stage]]
        assert hooks.steps == [expected]
