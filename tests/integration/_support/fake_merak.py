"""A stand-in for Merak's pipeline engine, dispatching exactly the way Merak does.

Merak cannot be installed in CI (it pins torch 1.10 and Python 3.9). What the adapter relies on
is reproduced here, written for these tests:

* ``Merak.runtime.schedule`` (:mod:`fake_merak_schedule`): instruction classes
  (``ForwardPass``, ``BackwardPass``, the recomputation variants ``PreCheckpointForwardPass`` /
  ``RecomputeRecvGrad`` / ``RestoreRecomputeStatus``, loads, sends, receives, the optimizer
  step), a synchronous 1F1B ``TrainSchedule`` (optionally Merak's early recomputation) and an
  ``InferenceSchedule``.
* ``Merak.runtime.pipe_engine.PipelineEngine``: a class-level ``_INSTRUCTION_MAP`` captured at
  class definition, ``_exec_schedule`` calling ``self._INSTRUCTION_MAP[type(cmd)](self, ...)``,
  ``_exec_forward_pass`` computing the loss on the last stage, ``_exec_backward_pass``,
  ``train_batch`` / ``eval_batch``; ``_exec_recompute_recv_grads`` recomputing and then calling
  the module's ``recv_backward``; and, as merak-zeus does, a Zeus-style frequency optimizer
  built from the module's ``PipelineFrequencyOptimizer`` in every engine and called around
  every forward and backward (here it records the clocks it would set).

Stages are engines in one process that run in threads and exchange activations and gradients
through queues, so a whole pipeline trains a real torch model without ``torch.distributed``.
:func:`installed` puts the modules into ``sys.modules`` and takes them out again.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from tests.integration._support import fake_merak_schedule
from tests.integration._support.fake_merak_schedule import (
    BackwardPass,
    ForwardPass,
    InferenceSchedule,
    LoadMicroBatch,
    OptimizerStep,
    PreCheckpointForwardPass,
    RecomputeRecvGrad,
    RecvActivation,
    RecvGrad,
    ReduceGrads,
    RestoreRecomputeStatus,
    SendActivation,
    SendGrad,
    TrainSchedule,
)
from tests.integration._support.merak_cpu import RecordingFrequencyOptimizer

# ------------------------------------------------------------------------ pipe_engine module

PIPE_ENGINE = "Merak.runtime.pipe_engine"

ZeusStyleFrequencyOptimizer = RecordingFrequencyOptimizer
"""merak-zeus's per-engine Zeus optimizer; records ``(rank, instruction)`` of each clock it
would set in ``RecordingFrequencyOptimizer.calls``."""


def recv_backward(channel: queue.Queue[torch.Tensor]) -> torch.Tensor:
    """Merak's ``p2p_communication.recv_backward``: block until the gradient arrives."""
    return channel.get(timeout=60)


def _module() -> types.ModuleType:
    # Merak's methods resolve recv_backward and PipelineFrequencyOptimizer in their module's
    # namespace when they run; the stand-in's module object is the installed one.
    return sys.modules[PIPE_ENGINE]


class Channels:
    """Point-to-point queues between the stages of one in-process pipeline."""

    def __init__(self) -> None:
        self._queues: Dict[Tuple[int, int, str], queue.Queue] = {}
        self._lock = threading.Lock()

    def get(self, src: int, dst: int, kind: str) -> queue.Queue:
        with self._lock:
            return self._queues.setdefault((src, dst, kind), queue.Queue())


class Grid:
    """The process grid methods the adapter reads (one data- and tensor-parallel rank)."""

    def __init__(self, stage_id: int) -> None:
        self.stage_id = stage_id

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_slice_parallel_rank(self) -> int:
        return 0


class PipelineEngine:
    """One stage of a pipeline, dispatching through the class-level ``_INSTRUCTION_MAP``."""

    def __init__(
        self,
        module: torch.nn.Module,
        stage_id: int,
        num_stages: int,
        micro_batches: int,
        channels: Channels,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        lr: float = 0.01,
        recompute: bool = False,
    ) -> None:
        self.module = module
        self.stage_id = stage_id
        self.num_stages = num_stages
        self.global_rank = stage_id
        self.local_rank = stage_id
        self.micro_batches = micro_batches
        self.channels = channels
        self.loss_model = loss_fn
        self.optimizer = torch.optim.SGD(module.parameters(), lr=lr)
        self.recompute = recompute
        self.grid = Grid(stage_id)
        self.data_iterator: Optional[Iterator[Any]] = None
        self.total_loss: Optional[torch.Tensor] = None
        self.fwd_outputs: List[torch.Tensor] = []
        self.pipe_buffers: Dict[str, Dict[int, Any]] = {}
        self.executed: List[str] = []
        self._compute_loss = True
        self.pipeline_frequency_optimizer = _module().PipelineFrequencyOptimizer(stage_id)

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def train_batch(self, data_iter: Optional[Iterator[Any]] = None) -> Optional[torch.Tensor]:
        if data_iter is not None:
            self.data_iterator = data_iter
        self.module.train()
        self.total_loss = None
        self._compute_loss = True
        self._exec_schedule(
            TrainSchedule(self.micro_batches, self.num_stages, self.stage_id, self.recompute)
        )
        return None if self.total_loss is None else self.total_loss / self.micro_batches

    def eval_batch(self, data_iter: Iterator[Any]) -> Optional[torch.Tensor]:
        self.module.eval()
        train_iter, self.data_iterator = self.data_iterator, data_iter
        self.total_loss = None
        with torch.no_grad():
            self._exec_schedule(
                InferenceSchedule(self.micro_batches, self.num_stages, self.stage_id)
            )
        self.data_iterator = train_iter
        return None if self.total_loss is None else self.total_loss / self.micro_batches

    def _exec_schedule(self, pipe_schedule: Any) -> None:
        self.pipe_buffers = {k: {} for k in ("inputs", "labels", "outputs", "grads", "losses")}
        self.fwd_outputs = []
        for step_cmds in pipe_schedule:
            for cmd in step_cmds:
                if type(cmd) not in self._INSTRUCTION_MAP:
                    raise RuntimeError(f"{type(self).__name__} does not understand {cmd!r}")
                self.executed.append(cmd.name)
                name = {ForwardPass: "forward", BackwardPass: "backward"}.get(type(cmd))
                if name is not None:
                    self.pipeline_frequency_optimizer.on_instruction_begin(name)
                self._INSTRUCTION_MAP[type(cmd)](self, **cmd.kwargs)
                if name is not None:
                    self.pipeline_frequency_optimizer.on_instruction_end(name)

    # -- instructions -------------------------------------------------------------------------
    def _exec_load_micro_batch(self, buffer_id: int) -> None:
        assert self.data_iterator is not None
        inputs, labels = next(self.data_iterator)
        if self.is_first_stage():
            self.pipe_buffers["inputs"][buffer_id] = inputs.clone()
        if self.is_last_stage():
            self.pipe_buffers["labels"][buffer_id] = labels.clone()

    def _stage_inputs(self, buffer_id: int) -> torch.Tensor:
        inputs = self.pipe_buffers["inputs"][buffer_id].detach().clone()
        if not self.is_first_stage():
            inputs.requires_grad_()
        self.pipe_buffers["inputs"][buffer_id] = inputs
        return inputs

    def _exec_forward_pass(self, buffer_id: int) -> None:
        outputs = self.module(self._stage_inputs(buffer_id))
        self.pipe_buffers["outputs"][buffer_id] = outputs
        if self.is_last_stage() and self._compute_loss:
            loss = self.loss_model(outputs, self.pipe_buffers["labels"][buffer_id])
            self.pipe_buffers["losses"][buffer_id] = loss
            self.fwd_outputs.append(loss.detach())
            detached = loss.detach()
            self.total_loss = (
                detached.clone() if self.total_loss is None else (self.total_loss + detached)
            )

    def _exec_precheckpoint_forward_pass(self, buffer_id: int) -> None:
        assert not self.is_last_stage(), "the last stage never pre-checkpoints"
        with torch.no_grad():
            outputs = self.module(self.pipe_buffers["inputs"][buffer_id])
        self.pipe_buffers["outputs"][buffer_id] = outputs

    def _exec_recompute_recv_grads(self, buffer_id: int) -> None:
        self.pipe_buffers["outputs"][buffer_id] = self.module(self._stage_inputs(buffer_id))
        channel = self.channels.get(self.stage_id + 1, self.stage_id, "grad")
        self.pipe_buffers["grads"][buffer_id] = _module().recv_backward(channel)

    def _exec_restore_recompute_status(self) -> None:
        pass

    def _exec_backward_pass(self, buffer_id: int) -> None:
        if self.is_last_stage():
            loss = self.pipe_buffers["losses"][buffer_id] / self.micro_batches
            loss.backward()
        else:
            outputs = self.pipe_buffers["outputs"][buffer_id]
            torch.autograd.backward(outputs, self.pipe_buffers["grads"][buffer_id])

    def _exec_send_activations(self, buffer_id: int) -> None:
        out = self.pipe_buffers["outputs"][buffer_id].detach().clone()
        self.channels.get(self.stage_id, self.stage_id + 1, "act").put(out)

    def _exec_recv_activations(self, buffer_id: int) -> None:
        got = self.channels.get(self.stage_id - 1, self.stage_id, "act").get(timeout=60)
        self.pipe_buffers["inputs"][buffer_id] = got

    def _exec_send_grads(self, buffer_id: int) -> None:
        grad = self.pipe_buffers["inputs"][buffer_id].grad.detach().clone()
        self.channels.get(self.stage_id, self.stage_id - 1, "grad").put(grad)

    def _exec_recv_grads(self, buffer_id: int) -> None:
        got = self.channels.get(self.stage_id + 1, self.stage_id, "grad").get(timeout=60)
        self.pipe_buffers["grads"][buffer_id] = got

    def _exec_reduce_grads(self) -> None:
        pass

    def _exec_optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()

    _INSTRUCTION_MAP = {
        OptimizerStep: _exec_optimizer_step,
        ReduceGrads: _exec_reduce_grads,
        LoadMicroBatch: _exec_load_micro_batch,
        ForwardPass: _exec_forward_pass,
        BackwardPass: _exec_backward_pass,
        SendActivation: _exec_send_activations,
        RecvActivation: _exec_recv_activations,
        SendGrad: _exec_send_grads,
        RecvGrad: _exec_recv_grads,
        PreCheckpointForwardPass: _exec_precheckpoint_forward_pass,
        RecomputeRecvGrad: _exec_recompute_recv_grads,
        RestoreRecomputeStatus: _exec_restore_recompute_status,
    }


# ------------------------------------------------------------------------------ installation

_SCHEDULE_NAMES = (
    "PipeInstruction",
    "BufferOpInstruction",
    "OptimizerStep",
    "ReduceGrads",
    "RestoreRecomputeStatus",
    "LoadMicroBatch",
    "ForwardPass",
    "BackwardPass",
    "SendActivation",
    "RecvActivation",
    "SendGrad",
    "RecvGrad",
    "PreCheckpointForwardPass",
    "RecomputeRecvGrad",
    "TrainSchedule",
    "InferenceSchedule",
)


def build_modules(
    engine_class: type = PipelineEngine, version: str = "0.1.0-standin"
) -> Dict[str, types.ModuleType]:
    """The fake ``Merak`` package modules, keyed by module name."""
    merak = types.ModuleType("Merak")
    merak.__version__ = version  # type: ignore[attr-defined]
    runtime = types.ModuleType("Merak.runtime")
    schedule = types.ModuleType("Merak.runtime.schedule")
    for name in _SCHEDULE_NAMES:
        setattr(schedule, name, getattr(fake_merak_schedule, name))
    pipe_engine = types.ModuleType(PIPE_ENGINE)
    pipe_engine.PipelineEngine = engine_class  # type: ignore[attr-defined]
    pipe_engine.PipelineFrequencyOptimizer = ZeusStyleFrequencyOptimizer  # type: ignore[attr-defined]
    pipe_engine.recv_backward = recv_backward  # type: ignore[attr-defined]
    pipe_engine.schedule = schedule  # type: ignore[attr-defined]
    merak.runtime = runtime  # type: ignore[attr-defined]
    runtime.schedule = schedule  # type: ignore[attr-defined]
    runtime.pipe_engine = pipe_engine  # type: ignore[attr-defined]
    for module in (merak, runtime):
        module.__path__ = []  # type: ignore[attr-defined]
    return {m.__name__: m for m in (merak, runtime, schedule, pipe_engine)}


@contextlib.contextmanager
def installed(modules: Optional[Dict[str, types.ModuleType]] = None) -> Iterator[Any]:
    """Put the fake Merak into ``sys.modules`` (restoring what was there afterwards)."""
    modules = modules or build_modules()
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield modules[PIPE_ENGINE]
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def run_pipeline(
    engines: Sequence[PipelineEngine], batches: Sequence[Any], *, evaluate: bool = False
) -> List[Optional[torch.Tensor]]:
    """Run one ``train_batch`` (or ``eval_batch``) on every stage, each in its own thread."""
    results: List[Optional[torch.Tensor]] = [None] * len(engines)
    errors: List[BaseException] = []

    def run(i: int) -> None:
        try:
            data = iter(list(batches))
            engine = engines[i]
            results[i] = engine.eval_batch(data) if evaluate else engine.train_batch(data)
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results
