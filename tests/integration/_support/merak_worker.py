"""One rank of the real-Merak checks: merak-zeus ``PipelineEngine`` objects, CPU, gloo, 2 ranks.

Runs in the Merak environment (``scripts/merak-env``: Python 3.9, torch 1.10, the user's
merak-zeus clone), started by :func:`tests.integration._support.launch.run_ranks`; the parent
test (``tests/integration/test_merak_adapter.py``, in ``.venv``) asserts on what :func:`main`
returns. One launch runs every check: importing Merak costs seconds.

The model is a small MLP (Linear + Tanh layers) split over the two stages, trained with Merak's
default activation checkpointing (one layer per checkpoint) in every schedule.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

# The DeepSpeed checks' sizes and data (ds_worker imports DeepSpeed only to build its engine).
from tests.integration._support.ds_worker import MICRO_BATCH, WIDTH, batches

# Merak's train_schedule names whose order is 1F1B, and the schedule class each one uses.
SCHEDULES = {
    "1f1b": "MergeP2PTrainSchedule",
    "ds_default": "TrainSchedule",
    "early_recompute_1f1b": "PreRecomputeTrainSchedule",
    "last_no_recompute_1f1b": "LastNoRecomputeTrainSchedule",
}
RECOMPUTE_SCHEDULES = ("early_recompute_1f1b", "last_no_recompute_1f1b")
SLOW_S = 0.2  # how long the slow stage's backward pass sleeps in the recompute-timing check
CLOCKS_MHZ = (1410, 1200, 1005, 810)


class ZeusUsed(RuntimeError):
    """Raised by the spy on Zeus's optimizer: Merak built its own frequency controller."""


def _slow_module() -> Any:
    import torch

    class SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(SLOW_S)
            return grad

    class Slow(torch.nn.Module):
        """Identity whose backward pass takes SLOW_S: a stage that is slow to send gradients."""

        def forward(self, x: Any) -> Any:
            return SlowBackward.apply(x)

    return Slow()


def build_engine(schedule: str, num_mb: int, seed: int, slow_stage1: bool = False) -> Any:
    """A real merak-zeus ``PipelineEngine``: 4 x (Linear, Tanh), 4 layers per stage."""
    import Merak
    import torch
    from Merak.modules.module import PipelineModule
    from Merak.runtime.pipe_engine import PipelineEngine
    from Merak.utils.merak_args import MerakArguments, manual_set_args

    args = MerakArguments(
        output_dir=tempfile.mkdtemp(prefix="merak-test-"),
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=num_mb,
        train_schedule=schedule,
        model_name="mlp",
        wall_clock_breakdown=False,
    )
    manual_set_args(args)
    linear = Merak.get_patched_func()[1]  # `import Merak` made torch.nn.Linear a proxy
    torch.manual_seed(seed)
    layers: List[Any] = []
    for _ in range(4):
        layers += [linear(WIDTH, WIDTH), torch.nn.Tanh()]
    parts = "custom:0,4,8"
    if slow_stage1:
        layers.insert(4, _slow_module())
        parts = "custom:0,4,9"

    def loss_fn(outputs: Any, labels: Tuple[Any, ...]) -> Any:
        return torch.nn.functional.mse_loss(outputs, labels[0])

    module = PipelineModule(
        layers=layers,
        loss_fn=loss_fn,
        topology=Merak.get_topo(),
        communicaiton_grid=Merak.get_grid(),
        partition_method=parts,
        activation_checkpoint_interval=1,
        tie_dims=set(),
        input_to_shard_dic={"inputs": 0},
    )
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": num_mb,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine = PipelineEngine(
        args=args,
        model=module,
        optimizer=torch.optim.Adam(module.parameters(), lr=1e-2),
        lr_scheduler=None,
        mpu=module.mpu(),
        dist_init_required=False,
        config=config,
        train_schedule=schedule,
        return_logits=False,
    )
    engine.input_to_stage_dic = module.input_to_stage_dic  # as MerakTrainer does
    return engine


def train_capturing(engine: Any, num_mb: int, steps: int) -> Dict[str, Any]:
    """Train ``steps`` iterations: losses, the gradients each optimizer step saw, parameters.

    Tensors come back as nested lists of floats (exact for float32), so the parent process
    (another Python and torch) compares them without unpickling torch 1.10 tensors.
    """
    params = list(engine.module.parameters())
    grads: List[List[Any]] = []
    optimizer = engine.optimizer
    step = optimizer.step

    def capturing_step(*args: Any, **kwargs: Any) -> Any:
        grads.append([p.grad.tolist() for p in params])
        return step(*args, **kwargs)

    optimizer.step = capturing_step
    # Merak keeps the iterator of its first train_batch call: one for all iterations.
    data = iter([b for s in range(steps) for b in batches(num_mb, seed=s)])
    losses = [float(engine.train_batch(data)) for _ in range(steps)]
    optimizer.step = step
    return {"losses": losses, "grads": grads, "params": [p.tolist() for p in params]}


class _ZeusSpy:
    """Records (and stops) any use of Zeus's frequency optimizer; NVML clock setters mocked."""

    def __init__(self) -> None:
        from unittest import mock

        optimizer = importlib.import_module("zeus.optimizer.pipeline_frequency.optimizer")
        controller = importlib.import_module(
            "zeus.optimizer.pipeline_frequency.frequency_controller"
        )
        pynvml = importlib.import_module("pynvml")
        self.events: List[str] = []
        self._spies = [
            mock.patch.object(owner, name, self._stop(f"{owner.__name__}.{name}"))
            for owner, name in (
                (optimizer.PipelineFrequencyOptimizer, "__init__"),
                (controller.FrequencyController, "__init__"),
                (controller.FrequencyController, "set_frequency"),
            )
        ]
        self._nvml = [
            mock.patch.object(pynvml, name, autospec=True)
            for name in (
                "nvmlDeviceSetGpuLockedClocks",
                "nvmlDeviceSetMemoryLockedClocks",
                "nvmlDeviceSetPowerManagementLimit",
            )
        ]
        self._nvml_mocks: List[Any] = []

    def _stop(self, what: str) -> Callable[..., None]:
        def spy(*args: Any, **kwargs: Any) -> None:
            self.events.append(what)
            raise ZeusUsed(f"Merak used Zeus's frequency optimizer: {what}")

        return spy

    def __enter__(self) -> _ZeusSpy:
        for spy in self._spies:
            spy.start()
        self._nvml_mocks = [patch.start() for patch in self._nvml]
        return self

    def __exit__(self, *exc: Any) -> None:
        for patch in self._spies + self._nvml:
            patch.stop()

    def nvml_calls(self) -> int:
        """Calls of the mocked NVML clock and power setters so far."""
        return sum(m.call_count for m in self._nvml_mocks)


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    import Merak

    from tests.integration._support import merak_cpu

    merak_cpu.install()
    Merak.init(2, 1, 1, backend="gloo")
    pipe_engine = importlib.import_module("Merak.runtime.pipe_engine")
    schedule = importlib.import_module("Merak.runtime.schedule")
    cls = pipe_engine.PipelineEngine
    originals = dict(cls._INSTRUCTION_MAP)
    original_train = cls.__dict__["train_batch"]
    zeus_class = pipe_engine.PipelineFrequencyOptimizer
    original_recv = pipe_engine.recv_backward
    out: Dict[str, Any] = {}
    with _ZeusSpy() as zeus:
        adapter = importlib.import_module("perseus.adapters.merak")  # the one-import promise
        out["patched"] = adapter.is_patched()
        replacement = pipe_engine.PipelineFrequencyOptimizer
        out["zeus_replaced"] = replacement is adapter.NoFrequencyOptimizer
        out.update(_with_adapter(args, schedule))
        out["zeus_events_with_adapter"] = list(zeus.events)
        out["nvml_set_calls_with_adapter"] = zeus.nvml_calls()

        adapter.unpatch()
        out["restored"] = (
            all(cls._INSTRUCTION_MAP[k] is v for k, v in originals.items())
            and cls.__dict__["train_batch"] is original_train
            and pipe_engine.PipelineFrequencyOptimizer is zeus_class
            and pipe_engine.recv_backward is original_recv
        )
        # Control: without the adapter, Merak builds Zeus's optimizer in every engine.
        try:
            build_engine("1f1b", 2, seed=0)
            out["zeus_without_adapter"] = "not used"
        except ZeusUsed:
            out["zeus_without_adapter"] = list(zeus.events)
    out.update(_without_adapter(pipe_engine))
    return out


def _with_adapter(args: Dict[str, Any], schedule: Any) -> Dict[str, Any]:
    from perseus.errors import AdapterError
    from perseus.runtime import context
    from tests.integration._support.recording import (
        HookLog,
        cycling_plan,
        plan_optimizer_factory,
        plan_record,
    )

    out: Dict[str, Any] = {"steps": {}, "errors": [], "eval_events": {}, "schedule_class": {}}
    # 1. Hook order of every schedule and microbatch count; evaluation is not reported.
    for name in SCHEDULES:
        for num_mb in args["num_microbatches"]:
            log = HookLog()
            context.configure(factory=log)
            engine = build_engine(name, num_mb, seed=num_mb)
            engine.train_batch(iter(batches(num_mb, seed=0)))
            (hooks,) = log.built
            before = len(hooks.events)
            engine.eval_batch(iter(batches(num_mb, seed=1)))
            out["steps"][(name, num_mb)] = hooks.steps
            out["errors"] += hooks.errors
            out["eval_events"][(name, num_mb)] = len(hooks.events) - before
            out["schedule_class"][name] = type(engine.train_sched).__name__
            out["rank_info"] = hooks.rank
            out.setdefault("rank_infos", {})[(name, num_mb)] = hooks.rank
            context.reset()

    # 2. The real PerseusOptimizer applying a plan: its clocks reach the GPU in plan order;
    #    losses and gradients are recorded to compare with a run without the adapter.
    out["with_adapter"], out["plan_gpu"] = {}, {}
    for name in SCHEDULES:
        plan = cycling_plan(2, 3, CLOCKS_MHZ)
        gpus: Dict[int, Any] = {}
        context.configure(factory=plan_optimizer_factory(plan, args["state_dir"], gpus))
        engine = build_engine(name, 3, seed=7)
        out["with_adapter"][name] = train_capturing(engine, 3, steps=2)
        context.reset()  # closes the optimizer: clocks restored
        out["plan_gpu"][name] = plan_record(plan, engine.stage_id, gpus[engine.stage_id])

    # 3. A schedule that is not 1F1B fails at its first step, before any work.
    log = HookLog()
    context.configure(factory=log)
    engine = build_engine("full_critical_path_1f1b", 3, seed=0)
    try:
        engine.train_batch(iter(batches(3, seed=0)))
        out["not_1f1b"] = "trained"
    except AdapterError as exc:
        out["not_1f1b"] = str(exc)
    out["not_1f1b_events"] = log.total_events()
    context.reset()

    # 4. Recompute timing: stage 1's backward passes sleep SLOW_S, so stage 0 waits for each
    #    gradient inside RecomputeRecvGrad. Its recorded backward must be its own work only.
    out["recompute_timing"] = {
        name: _recompute_timing(name, schedule) for name in RECOMPUTE_SCHEDULES
    }
    return out


def _recompute_timing(name: str, schedule: Any) -> Dict[str, Any]:
    from perseus.runtime import context
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import MeasureSource
    from tests.unit.runtime.fakes import RecordingGPU

    pipe_engine = importlib.import_module("Merak.runtime.pipe_engine")
    built: List[PerseusOptimizer] = []

    def factory(rank: Any) -> PerseusOptimizer:
        built.append(PerseusOptimizer.on_gpu(rank, RecordingGPU(fast=True), MeasureSource()))
        return built[-1]

    context.configure(factory=factory)
    num_mb = 3
    engine = build_engine(name, num_mb, seed=3, slow_stage1=True)
    # Spies outside the adapter's wrappers: which backward passes recomputed, and how long
    # each gradient receive inside a recomputation blocked.
    waits: List[float] = []
    recomputed: List[int] = []
    backward_count = [0]
    recompute_entry = engine._INSTRUCTION_MAP[schedule.RecomputeRecvGrad]
    backward_entry = engine._INSTRUCTION_MAP[schedule.BackwardPass]
    receive = pipe_engine.recv_backward
    inside = [False]

    def timed_receive(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return receive(*args, **kwargs)
        finally:
            if inside[0]:
                waits.append(time.perf_counter() - t0)

    def spy_recompute(self: Any, **kwargs: Any) -> Any:
        recomputed.append(backward_count[0])
        inside[0] = True
        try:
            return recompute_entry(self, **kwargs)
        finally:
            inside[0] = False

    def spy_backward(self: Any, **kwargs: Any) -> Any:
        backward_count[0] += 1
        return backward_entry(self, **kwargs)

    data = iter(batches(num_mb, seed=0) + batches(num_mb, seed=1))
    engine.train_batch(data)  # first iteration: buffers, tensor metadata
    instruction_map = type(engine)._INSTRUCTION_MAP
    instruction_map[schedule.RecomputeRecvGrad] = spy_recompute
    instruction_map[schedule.BackwardPass] = spy_backward
    pipe_engine.recv_backward = timed_receive
    try:
        engine.train_batch(data)
    finally:
        instruction_map[schedule.RecomputeRecvGrad] = recompute_entry
        instruction_map[schedule.BackwardPass] = backward_entry
        pipe_engine.recv_backward = receive
    (opt,) = built
    record = opt.last_step
    assert record is not None
    backward_s = [r.end_s - r.start_s for r in record.instructions if r.instruction == "backward"]
    context.reset()
    return {
        "stage": engine.stage_id,
        "backward_s": backward_s,
        "recomputed": recomputed,
        "receive_waits_s": waits,
        "iteration_s": record.iteration_time_s,
    }


def _without_adapter(pipe_engine: Any) -> Dict[str, Any]:
    from tests.integration._support.merak_cpu import RecordingFrequencyOptimizer

    zeus_class = pipe_engine.PipelineFrequencyOptimizer
    pipe_engine.PipelineFrequencyOptimizer = RecordingFrequencyOptimizer
    try:
        runs = {name: train_capturing(build_engine(name, 3, seed=7), 3, 2) for name in SCHEDULES}
    finally:
        pipe_engine.PipelineFrequencyOptimizer = zeus_class
    return {
        "without_adapter": runs,
        "merak_own_optimizer_calls": len(RecordingFrequencyOptimizer.calls),
    }
