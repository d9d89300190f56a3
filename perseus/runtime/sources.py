"""Frequency sources: who decides the SM clock of each instruction.

* :class:`MeasureSource` never touches clocks; the optimizer only measures.
* :class:`MaxSpeedSource` runs every instruction at one clock (the device's highest).
* :class:`PlanSource` applies a :class:`perseus.formats.plan.document.Plan` and checks that the
  training framework runs instructions in the order the plan expects.

The online profiler's source lives in :mod:`perseus.runtime.online.source`; :func:`build_source`
picks the one ``runtime.mode`` names. ``frequency_mhz`` runs on the training critical path: plan
lookups are precomputed per position.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from perseus.errors import ConfigError, PlanError, ScheduleMismatchError
from perseus.formats.plan.document import Plan
from perseus.pipeline_order import PipelineOrder
from perseus.records import RankInfo, StepRecord
from perseus.runtime.launch.endpoint import Endpoint
from perseus.runtime.types import FrequencySource
from perseus.schedule import ScheduleLike

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.runtime.launch.rendezvous import Launch


class _LocalSource:
    """What the sources without a server share: no endpoint, nothing to close."""

    endpoint: Optional[Endpoint] = None

    def iteration_clocks(self) -> Optional[Sequence[Optional[int]]]:
        """Not known ahead (nothing changes within an iteration)."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class MeasureSource(_LocalSource):
    """Leave the clocks alone: every instruction runs at whatever the driver picks."""

    changes_clocks = False

    def begin_step(self, step: int) -> None:
        """Nothing to prepare."""

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """Always ``None`` (default clocks)."""
        return None

    def end_step(self, record: StepRecord) -> None:
        """Nothing to learn."""


class MaxSpeedSource(_LocalSource):
    """Every instruction at one SM clock, normally the highest the device supports.

    Args:
        max_mhz: The clock to lock (MHz).
    """

    changes_clocks = True

    def __init__(self, max_mhz: int) -> None:
        """Lock every instruction at ``max_mhz``."""
        if max_mhz <= 0:
            raise PlanError(f"MaxSpeedSource(max_mhz={max_mhz}): the clock must be > 0 MHz")
        self.max_mhz = int(max_mhz)

    def begin_step(self, step: int) -> None:
        """Nothing to prepare."""

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """The fixed clock."""
        return self.max_mhz

    def end_step(self, record: StepRecord) -> None:
        """Nothing to learn."""


class PlanSource(_LocalSource):
    """Apply one stage's part of a frequency plan, position by position.

    The optimizer numbers the instructions of an iteration 0, 1, 2, ... on this stage and counts
    microbatches per instruction kind. In strict mode an instruction that is not the one the plan
    has at that position raises :class:`~perseus.errors.ScheduleMismatchError` naming the
    position, the expected instruction and microbatch, and what came instead. In non-strict mode
    the first mismatch warns once; from then on instructions are looked up by (instruction,
    occurrence) and anything the plan does not cover runs at the plan's highest clock of that
    instruction kind (never slower than the plan intends).

    Args:
        plan: The plan to apply.
        stage: This rank's pipeline stage (index into ``plan.stages``).
        strict: Raise on a mismatch (True) or warn once and fall back (False).
    """

    changes_clocks = True

    def __init__(self, plan: Plan, stage: int, strict: bool = True) -> None:
        """Precompute the per-position arrays of ``plan.stages[stage]``."""
        if not 0 <= stage < plan.num_stages:
            raise PlanError(
                f"the plan has {plan.num_stages} stage(s) but this rank is stage {stage}; "
                "plan for the job's parallelism.pp (regenerate the plan with perseus-plan)"
            )
        steps = plan.stages[stage]
        self.plan = plan
        self.stage = stage
        self.strict = strict
        self.names: List[str] = [s.instruction for s in steps]
        self.microbatches: List[int] = [s.microbatch for s in steps]
        self.freqs_mhz: List[int] = [s.frequency_mhz for s in steps]
        self._timeline: Tuple[Optional[int], ...] = tuple(self.freqs_mhz)
        self.num_positions = len(steps)
        self._by_occurrence = _occurrence_table(self.names, self.freqs_mhz)
        self._fallback_mhz = {
            name: max(f for n, f in zip(self.names, self.freqs_mhz) if n == name)
            for name in set(self.names)
        }
        self._fell_back = False

    def begin_step(self, step: int) -> None:
        """Nothing to prepare: the plan is the same every iteration."""

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """The plan's clock at ``position``, after checking the instruction matches."""
        if (
            not self._fell_back
            and position < self.num_positions
            and self.names[position] == instruction
        ):
            return self.freqs_mhz[position]
        return self._mismatch(step, position, instruction, microbatch)

    def iteration_clocks(self) -> Optional[Sequence[Optional[int]]]:
        """The plan's clocks by position (``None`` once it fell back to per-instruction ones)."""
        return None if self._fell_back else self._timeline

    def end_step(self, record: StepRecord) -> None:
        """Check that the iteration ran every instruction the plan has."""
        ran = len(record.instructions)
        if ran == self.num_positions or self._fell_back:
            return
        if ran < self.num_positions:
            got = f"the iteration ended after {ran} instruction(s)"
        else:  # pragma: no cover - frequency_mhz already reported the extra instruction
            got = f"the iteration ran {ran} instructions"
        self._report(record.step, ran, got)

    # -- mismatch handling ---------------------------------------------------------------------
    def _mismatch(self, step: int, position: int, instruction: str, microbatch: int) -> int:
        if not self._fell_back:
            self._report(step, position, f"got {instruction} of microbatch {microbatch}")
        fallback = self._by_occurrence.get((instruction, microbatch))
        if fallback is None:
            fallback = self._fallback_mhz.get(instruction, max(self.freqs_mhz))
        return fallback

    def _report(self, step: int, position: int, got: str) -> None:
        if position < self.num_positions:
            expected = (
                f"expected {self.names[position]} of microbatch {self.microbatches[position]} "
                f"at position {position}"
            )
        else:
            expected = (
                f"expected the iteration to end after {self.num_positions} instructions "
                f"(position {position} is past the plan's end)"
            )
        message = (
            f"stage {self.stage}, iteration {step}: {expected}, but {got}. The plan "
            f"({self.plan.schedule}, {self.plan.num_stages} stages, "
            f"{self.plan.num_microbatches} microbatches) does not match the framework's "
            "schedule: plan with the job's parallelism.schedule / num_microbatches, or set "
            "runtime.strict=false to warn and fall back"
        )
        if self.strict:
            raise ScheduleMismatchError(message)
        self._fell_back = True
        warnings.warn(
            message + "; falling back to per-(instruction, microbatch) clocks",
            RuntimeWarning,
            stacklevel=4,
        )


def _occurrence_table(names: List[str], freqs_mhz: List[int]) -> Dict[Tuple[str, int], int]:
    """Map (instruction, k) to the clock of the k-th occurrence of that instruction."""
    counts: Dict[str, int] = {}
    table: Dict[Tuple[str, int], int] = {}
    for name, freq in zip(names, freqs_mhz):
        k = counts.get(name, 0)
        table[(name, k)] = freq
        counts[name] = k + 1
    return table


def build_source(cfg: PerseusConfig, rank: RankInfo, gpu: GPU, launch: Launch) -> FrequencySource:
    """The frequency source ``cfg.runtime.mode`` asks for (``launch``: the process's launch).

    * ``measure``: no clock changes at all;
    * ``max_speed``: every instruction at the GPU's highest SM clock;
    * ``plan``: ``runtime.plan`` (a ``perseus-plan/1`` JSON or a reference
      ``freqs_pipeline_%05d.py``), checked against ``parallelism.pp``,
      ``parallelism.num_microbatches`` and the clocks the GPU supports;
    * ``online``: the coordination server's profiler and plans, joining ``launch``
      (:func:`perseus.runtime.online.build.build_online_source`, imported only for this mode).
    """
    mode = cfg.runtime.mode
    if mode == "measure":
        return MeasureSource()
    if mode == "max_speed":
        return MaxSpeedSource(max(gpu.supported_sm_clocks_mhz()))
    if mode == "plan":
        return _plan_source(cfg, rank, gpu)
    if mode == "online":
        from perseus.runtime.online.build import build_online_source

        return build_online_source(cfg, rank, gpu, launch)
    raise ConfigError(f"runtime.mode={mode!r}: choose measure, max_speed, plan or online")


def _plan_source(cfg: PerseusConfig, rank: RankInfo, gpu: GPU) -> PlanSource:
    from perseus.formats.plan.document import check_plan_for_job, load_plan
    from perseus.gpu.preflight import check_plan_clocks

    if not cfg.runtime.plan:
        raise ConfigError("runtime.mode=plan needs runtime.plan=<path of a plan JSON>")
    plan = load_plan(cfg.runtime.plan)
    schedule: ScheduleLike = cfg.parallelism.schedule
    if rank.order is not None:  # the engine's own actions (torch.distributed.pipelining)
        schedule = PipelineOrder(rank.schedule or "custom", list(rank.order))
    # Strict: a plan whose order is not the job's is refused now, naming the file, the stage
    # and the first position that differs; otherwise the source falls back at run time.
    check_plan_for_job(
        plan,
        num_stages=rank.num_stages,
        num_microbatches=cfg.parallelism.num_microbatches,
        source=cfg.runtime.plan,
        schedule=schedule if cfg.runtime.strict else None,
        num_model_chunks=cfg.parallelism.num_model_chunks,
    )
    # A plan's clocks must exist on this GPU (rejected, never snapped).
    check_plan_clocks(plan.frequencies(rank.stage), gpu, f"plan {cfg.runtime.plan}")
    return PlanSource(plan, rank.stage, strict=cfg.runtime.strict)
