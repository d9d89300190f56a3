"""One rank of the Megatron-core adapter checks: real pipeline schedules, pp=2 over gloo, on CPU.

The schedules hard-code CUDA; :mod:`cuda_redirect` moves them to the CPU for the test. The model
is a small stack of linear layers per model chunk with the attributes the schedules read
(``config``, ``model_type``, ``set_input_tensor``). All checks share one launch; the parent
test asserts on what :func:`main` returns.
"""

from __future__ import annotations

import importlib
import warnings
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

SEQ = 4
MICRO_BATCH = 2
HIDDEN = 8
_ORIGINALS: Dict[str, Any] = {}  # the schedules' functions before the adapter patched them


def _chunk_class() -> Any:
    import torch
    from megatron.core.enums import ModelType

    class Chunk(torch.nn.Module):
        """Two linear+tanh layers; takes the data or the received activation."""

        model_type = ModelType.encoder_or_decoder

        def __init__(self, config: Any) -> None:
            super().__init__()
            self.config = config
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(HIDDEN, HIDDEN),
                torch.nn.Tanh(),
                torch.nn.Linear(HIDDEN, HIDDEN),
                torch.nn.Tanh(),
            )
            self.input_tensor: Optional[Any] = None

        def set_input_tensor(self, tensor: Any) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, x: Any) -> Any:
            return self.layers(x if self.input_tensor is None else self.input_tensor)

    return Chunk


def build_model(seed: int, num_chunks: int) -> List[Any]:
    """This rank's model chunks (the same weights for the same seed)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2 * num_chunks,
        hidden_size=HIDDEN,
        num_attention_heads=1,
        pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
        virtual_pipeline_model_parallel_size=num_chunks if num_chunks > 1 else None,
    )
    torch.manual_seed(seed + 100 * torch.distributed.get_rank())
    chunk = _chunk_class()
    return [chunk(config) for _ in range(num_chunks)]


def batches(num_mb: int, seed: int) -> List[Dict[str, Any]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "x": torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=gen),
            "y": torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=gen),
        }
        for _ in range(num_mb)
    ]


def _loss(target: Any, output: Any) -> Tuple[Any, Dict[str, Any]]:
    import torch

    loss = torch.nn.functional.mse_loss(output, target)
    return loss, {"loss": loss.detach()}


class Runner:
    """Calls a forward-backward function the way a training loop does; records chunk order."""

    def __init__(self, model: List[Any]) -> None:
        import torch

        self.model = model
        self.params = [p for chunk in model for p in chunk.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=1e-2)
        self.forward_chunks: List[int] = []

    def forward_step(self, data_iterator: Any, model: Any) -> Tuple[Any, Any]:
        self.forward_chunks.append(next(i for i, c in enumerate(self.model) if c is model))
        batch = next(data_iterator)
        return model(batch["x"]), partial(_loss, batch["y"])

    def step(self, fb: Any, num_mb: int, seed: int, forward_only: bool = False) -> Dict[str, Any]:
        data = batches(num_mb, seed)
        iters: Any = [iter(data) for _ in self.model] if len(self.model) > 1 else iter(data)
        model: Any = self.model if len(self.model) > 1 else self.model[0]
        self.optimizer.zero_grad()
        out = fb(
            forward_step_func=self.forward_step,
            data_iterator=iters,
            model=model,
            num_microbatches=num_mb,
            seq_length=SEQ,
            micro_batch_size=MICRO_BATCH,
            forward_only=forward_only,
        )
        grads = [] if forward_only else [p.grad.detach().clone() for p in self.params]
        if not forward_only:
            self.optimizer.step()
        return {"losses": [float(o["loss"]) for o in out], "grads": grads}


def train(runner: Runner, fb: Any, num_mb: int, steps: int) -> Dict[str, Any]:
    results = [runner.step(fb, num_mb, seed=s) for s in range(steps)]
    return {
        "losses": [r["losses"] for r in results],
        "grads": [r["grads"] for r in results],
        "params": [p.detach().clone() for p in runner.params],
    }


def _pipeline_checks(args: Dict[str, Any], out: Dict[str, Any]) -> None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from perseus.runtime import context
    from tests.integration._support.recording import (
        HookLog,
        cycling_plan,
        plan_optimizer_factory,
        plan_record,
    )

    adapter = importlib.import_module("perseus.adapters.megatron")
    # 1. Hook order for several microbatch counts (1F1B); forward_only is not reported.
    log = HookLog()
    context.configure(factory=log)
    runner = Runner(build_model(seed=0, num_chunks=1))
    fb = get_forward_backward_func()
    out["fb_name"] = fb.__name__
    for n in args["num_microbatches"]:
        runner.step(fb, n, seed=n)
    (hooks,) = log.built
    before = len(hooks.events)
    runner.step(get_forward_backward_func(), 2, seed=7, forward_only=True)
    out.update(
        steps=hooks.steps,
        errors=hooks.errors,
        rank_info=hooks.rank,
        eval_events=len(hooks.events) - before,
    )
    # A second model in the same process gets its own optimizer.
    Runner(build_model(seed=0, num_chunks=1)).step(fb, 2, seed=0)
    out["num_hook_objects"] = len(log.built)
    context.reset()

    # 2. Real PerseusOptimizer with a plan: frequencies reach the GPU in plan order, and
    #    losses and gradients equal those of a run without the adapter.
    plan = cycling_plan(2, 3, (1410, 1200, 1005, 810))
    gpus: Dict[int, Any] = {}
    context.configure(factory=plan_optimizer_factory(plan, args["state_dir"], gpus))
    out["with_adapter"] = train(Runner(build_model(seed=1, num_chunks=1)), fb, 3, steps=2)
    context.reset()
    stage = out["rank_info"].stage
    out["plan_gpu"] = plan_record(plan, stage, gpus[stage])
    adapter.unpatch()
    import megatron.core.pipeline_parallel.schedules as schedules

    out["restored"] = all(getattr(schedules, name) is fn for name, fn in _ORIGINALS.items())
    out["without_adapter"] = train(
        Runner(build_model(seed=1, num_chunks=1)), get_forward_backward_func(), 3, steps=2
    )
    adapter.patch()


def _early_reference_check(early_fb: Any, out: Dict[str, Any]) -> None:
    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    log = HookLog()
    context.configure(factory=log)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(build_model(seed=0, num_chunks=1)).step(early_fb, 2, seed=0)
    out["early_events"] = log.total_events()
    out["early_warnings"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
    context.reset()


def _interleaved_checks(args: Dict[str, Any], out: Dict[str, Any]) -> None:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    adapter = importlib.import_module("perseus.adapters.megatron")
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 2, virtual_pipeline_model_parallel_size=2)
    log = HookLog()
    runner = Runner(build_model(seed=3, num_chunks=2))
    fb = get_forward_backward_func()
    out["interleaved_fb_name"] = fb.__name__
    chunks: List[List[Tuple[str, int]]] = []

    # Record the model chunk the adapter reports at every instruction begin.
    class ChunkSpy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.seen: List[Tuple[str, int]] = []

        def on_step_begin(self) -> None:
            self.inner.on_step_begin()

        def on_step_end(self) -> None:
            self.inner.on_step_end()

        def on_instruction_begin(self, name: str) -> None:
            self.seen.append((name, adapter.current_model_chunk()))
            self.inner.on_instruction_begin(name)

        def on_instruction_end(self, name: str) -> None:
            self.inner.on_instruction_end(name)

    spies: List[ChunkSpy] = []

    def factory(rank: Any) -> ChunkSpy:
        spy = ChunkSpy(log(rank))
        spies.append(spy)
        return spy

    context.configure(factory=factory)
    for n in args["interleaved_microbatches"]:
        runner.forward_chunks = []
        start = len(spies[0].seen) if spies else 0
        runner.step(fb, n, seed=n)
        chunks.append(spies[0].seen[start:])
        out.setdefault("interleaved_forward_chunks", []).append(list(runner.forward_chunks))
    (hooks,) = log.built
    out.update(
        interleaved_steps=hooks.steps,
        interleaved_errors=hooks.errors,
        interleaved_rank_info=hooks.rank,
        interleaved_chunks=chunks,
    )
    context.reset()


def _no_pipelining_check(args: Dict[str, Any], out: Dict[str, Any]) -> None:
    """pp=1 (the 2 ranks are data-parallel replicas): the no-pipelining schedule is reported."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 1)
    log = HookLog()
    context.configure(factory=log)
    fb = get_forward_backward_func()
    runner = Runner(build_model(seed=4, num_chunks=1))
    for n in args["num_microbatches"]:
        runner.step(fb, n, seed=n)
    before = len(log.built[0].events)
    runner.step(fb, 2, seed=7, forward_only=True)
    (hooks,) = log.built
    out.update(
        no_pipelining_fb_name=fb.__name__,
        no_pipelining_steps=hooks.steps,
        no_pipelining_errors=hooks.errors,
        no_pipelining_rank_info=hooks.rank,
        no_pipelining_eval_events=len(hooks.events) - before,
    )
    context.reset()


def _gpt_check(args: Dict[str, Any], out: Dict[str, Any]) -> None:
    """A real GPTModel split over the 2 stages, trained by the patched 1F1B schedule."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 2)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=64,
        max_sequence_length=SEQ,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    gen = torch.Generator().manual_seed(5)
    positions = torch.arange(SEQ).unsqueeze(0)
    mask = torch.tril(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool)).logical_not()

    def forward_step(data_iterator: Any, chunk: Any) -> Tuple[Any, Any]:
        tokens = next(data_iterator)
        output = chunk(tokens, positions, mask, labels=tokens)

        def loss_func(per_token: Any) -> Tuple[Any, Dict[str, Any]]:
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach()}

        return output, loss_func

    log = HookLog()
    context.configure(factory=log)
    num_mb = args["gpt_microbatches"]
    data = [torch.randint(0, 64, (MICRO_BATCH, SEQ), generator=gen) for _ in range(num_mb)]
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(data),
        model=[model],
        num_microbatches=num_mb,
        seq_length=SEQ,
        micro_batch_size=MICRO_BATCH,
    )
    (hooks,) = log.built
    out.update(
        gpt_steps=hooks.steps,
        gpt_errors=hooks.errors,
        gpt_losses=[float(x["loss"]) for x in losses],
        gpt_stage=hooks.rank.stage,
    )
    context.reset()


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from tests.integration._support.cuda_redirect import cuda_on_cpu

    out: Dict[str, Any] = {}
    with cuda_on_cpu():
        dist.init_process_group("gloo")
        parallel_state.initialize_model_parallel(1, 2)
        early_fb = get_forward_backward_func()  # taken before the adapter is imported
        import megatron.core.pipeline_parallel.schedules as schedules

        names = (
            "forward_step",
            "backward_step",
            "forward_backward_no_pipelining",
            "forward_backward_pipelining_without_interleaving",
            "forward_backward_pipelining_with_interleaving",
        )
        _ORIGINALS.update({name: getattr(schedules, name) for name in names})
        adapter = importlib.import_module("perseus.adapters.megatron")
        out["patched"] = adapter.is_patched()
        _pipeline_checks(args, out)
        _early_reference_check(early_fb, out)
        _interleaved_checks(args, out)
        _no_pipelining_check(args, out)
    with cuda_on_cpu(rng_tracker=True):
        _gpt_check(args, out)
        adapter.unpatch()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    return out
