"""One rank of perseus-train's Megatron job on CPU: pp=2 over gloo, CUDA redirected (tests only).

The product's ``megatron_job.train`` runs unchanged: a real Megatron-core ``GPTModel`` (gpt3-tiny
sizes) trained by Megatron's 1F1B schedule, wrapped by the Megatron adapter; the hooks go to a
recording factory so the parent test can compare their order with the 1F1B schedule.
"""

from __future__ import annotations

from typing import Any, Dict, List


class Recorder:
    """Hooks that record what the adapter called."""

    def __init__(self) -> None:
        self.calls: List[str] = []

    def on_step_begin(self) -> None:
        self.calls.append("step")

    def on_step_end(self) -> None:
        self.calls.append("end")

    def on_instruction_begin(self, name: str) -> None:
        self.calls.append(name)

    def on_instruction_end(self, name: str) -> None:
        pass


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    import torch.distributed as dist
    from megatron.core import parallel_state

    from perseus.config.schema import PerseusConfig
    from perseus.runtime import context
    from perseus.train.jobs import megatron as megatron_job
    from tests.integration._support.cuda_redirect import cuda_on_cpu

    cfg = PerseusConfig()
    cfg.framework.name = "megatron"
    cfg.runtime.mode = "measure"
    cfg.parallelism.pp = 2
    cfg.parallelism.num_microbatches = args["num_microbatches"]
    cfg.train.warmup_steps, cfg.train.measure_steps = 0, args["steps"]
    cfg.train.progress = False
    recorder = Recorder()
    context.configure(factory=lambda _rank: recorder)
    losses: List[float] = []
    with cuda_on_cpu(rng_tracker=True):
        dist.init_process_group("gloo")
        parallel_state.initialize_model_parallel(1, 2)
        import perseus.train.loop as loop

        original = loop.run_loop

        def recording_loop(cfg: Any, step_fn: Any, **kwargs: Any) -> int:
            def step() -> float:
                loss = step_fn()
                losses.append(loss)
                return loss

            return original(cfg, step, **kwargs)

        loop.run_loop = recording_loop
        try:
            steps = megatron_job.train(cfg)
        finally:
            loop.run_loop = original
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    context.reset()
    return {"steps": steps, "calls": recorder.calls, "losses": losses}
