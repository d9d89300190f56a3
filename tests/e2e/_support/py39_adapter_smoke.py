"""Run by tests/e2e/test_python39.py under Python 3.9 with the core installation (no torch).

Imports the adapters the way a Merak process on Python 3.9 does and drives the Merak adapter
through a torch-free engine shaped like Merak's. Uses the installed ``perseus`` package.
"""

import importlib
import sys
import types


class ForwardPass:
    pass


class BackwardPass:
    pass


class RecomputeRecvGrad:
    pass


class Grid:
    def get_data_parallel_rank(self):
        return 0

    def get_slice_parallel_rank(self):
        return 0


class PipelineEngine:
    """Dispatches through a class-level map captured at class definition, like Merak."""

    def __init__(self):
        self.stage_id, self.num_stages, self.global_rank, self.local_rank = 1, 2, 1, 0
        self.grid = Grid()

    def _forward(self, buffer_id):
        pass

    def _backward(self, buffer_id):
        pass

    def _recompute(self, buffer_id):
        pass

    def train_batch(self):
        for instruction in (ForwardPass, RecomputeRecvGrad, BackwardPass):
            self._INSTRUCTION_MAP[instruction](self, buffer_id=0)

    _INSTRUCTION_MAP = {
        ForwardPass: _forward,
        BackwardPass: _backward,
        RecomputeRecvGrad: _recompute,
    }


class Hooks:
    def __init__(self, events):
        self.events = events

    def on_step_begin(self):
        self.events.append("S")

    def on_step_end(self):
        self.events.append("E")

    def on_instruction_begin(self, name):
        self.events.append("+" + name)

    def on_instruction_end(self, name):
        self.events.append("-" + name)


def install_fake_merak():
    schedule = types.ModuleType("Merak.runtime.schedule")
    schedule.ForwardPass = ForwardPass
    schedule.BackwardPass = BackwardPass
    schedule.RecomputeRecvGrad = RecomputeRecvGrad
    pipe_engine = types.ModuleType("Merak.runtime.pipe_engine")
    pipe_engine.PipelineEngine = PipelineEngine
    merak = types.ModuleType("Merak")
    merak.__path__ = []
    merak.__version__ = "py39-check"
    runtime = types.ModuleType("Merak.runtime")
    runtime.__path__ = []
    for module in (merak, runtime, schedule, pipe_engine):
        sys.modules[module.__name__] = module


def main():
    install_fake_merak()
    context = importlib.import_module("perseus.runtime.context")
    events, ranks = [], []

    def factory(rank):
        ranks.append(rank)
        return Hooks(events)

    context.configure(factory=factory)
    adapter = importlib.import_module("perseus.adapters.merak")  # patches
    PipelineEngine().train_batch()
    print(sys.version.split()[0], events, ranks[0])
    adapter.unpatch()
    assert not adapter.is_patched()
    for name in ("perseus.adapters._common", "perseus.adapters._instruction_map"):
        importlib.import_module(name)
    print("ok", importlib.import_module("perseus.adapters").available())


if __name__ == "__main__":
    main()
