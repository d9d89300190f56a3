"""A server job's live snapshot and detail, made from its view and its telemetry.

:func:`job_snapshot` is what the metrics and the page's list show of a job
(:class:`~perseus.observability.snapshot.JobSnapshot`); :func:`job_detail` what the page's view
of one job draws besides (:class:`~perseus.observability.snapshot.JobDetail`). Both run under the
job's lock (the job calls them), from the :class:`~perseus.server.jobs.summary.JobView` the
summary is made from and the job's :class:`~perseus.server.live.telemetry.JobTelemetry`.

What depends only on the solved plans (the frontier's points, the planned timeline of a plan,
the predicted saving with its interval) is computed once per plan and kept in the telemetry's
memo. The page draws stages, never ranks, and at most :data:`MAX_BOXES` instructions per stage,
:data:`MAX_FRONTIER` plans and :data:`MAX_POWER_SERIES` GPUs, whatever the job's size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from perseus.observability.snapshot import (
    PIPELINE,
    ArmFigures,
    FrontierPlan,
    GpuReading,
    Interval,
    JobDetail,
    JobSnapshot,
    TimelineBox,
)
from perseus.pipeline_order import LETTERS
from perseus.server.jobs.steps import typical_step
from perseus.server.jobs.summary import JobView
from perseus.server.live.telemetry import JobTelemetry
from perseus.server.planning import PlanResult, predicted_saving
from perseus.wire import Phase, ProfilerSettings

if TYPE_CHECKING:
    from perseus.profiler.comparison import Comparison
    from perseus.server.phases.table import JobPhase

# The most the page draws of one job.
MAX_BOXES = 512
MAX_FRONTIER = 2000
MAX_POWER_SERIES = 64
STEPS_SHOWN = 600


def job_snapshot(
    view: JobView,
    tel: JobTelemetry,
    *,
    num_stages: int,
    profiling: Tuple[Optional[int], Optional[int], Optional[float]],
    ranks: Dict[str, int],
) -> JobSnapshot:
    """The job's :class:`JobSnapshot`.

    Args:
        view: The job's view (as the summary has it).
        tel: The job's telemetry.
        num_stages: The job's stages.
        profiling: Profiling iterations run, the most it may run, and its progress (0 to 1).
        ranks: How many ranks are alive, dead and finished.
    """
    record = view.record
    measured = record.measured
    comparison = measured.comparison() if measured is not None and measured.blocks else None
    arms, saving, slowdown, saved = _measured(view, tel, comparison)
    epoch = view.epoch
    last = tel.steps[-1] if tel.steps else None
    last_energy = next((p.energy_j for p in reversed(tel.steps) if p.energy_j is not None), None)
    steps, max_steps, progress = profiling
    phases = tel.phases
    return JobSnapshot(
        job_id=view.job_id,
        kind=PIPELINE,
        phase=str(view.phase),
        updated_s=tel.wall(),
        phase_since_s=phases[-1].time_s if phases else None,
        step=None if last is None else last.step,
        num_stages=num_stages,
        ranks=ranks,
        profiling_steps=steps,
        profiling_max_steps=max_steps,
        profiling_progress=progress,
        plan_id=None if epoch is None else epoch.default.plan_id,
        plan_reason=None if epoch is None else epoch.reason,
        plan_since_step=None if epoch is None else epoch.start_step,
        message=view.failure or view.message,
        arms=arms,
        last_iteration_time_s=None if last is None else last.iteration_time_s,
        last_energy_j=last_energy,
        predicted_saving=None if view.result is None else _predicted(view.result, tel),
        energy_saving=saving,
        slowdown=slowdown,
        energy_saved_j=saved,
        gpus=tuple(
            GpuReading(
                rank=g.rank,
                stage=g.stage,
                gpu=g.gpu,
                energy_j=g.counter.energy_j,
                power_w=g.counter.power_w,
                sm_clock_mhz=tel.stage_clock_mhz(g.stage),
                power_limit_w=g.power_limit_w,
            )
            for g in sorted(tel.gpus.values(), key=lambda g: (g.stage, g.rank))
        ),
        retired=tel.retired_s is not None,
        phases_entered_s=_entered(tel),
    )


def _entered(tel: JobTelemetry) -> Dict[str, float]:
    """When the job first entered each phase it went through."""
    out: Dict[str, float] = {}
    for change in tel.phases:
        out.setdefault(change.phase, change.time_s)
    return out


def _measured(
    view: JobView, tel: JobTelemetry, comparison: Optional[Comparison]
) -> Tuple[Tuple[ArmFigures, ...], Optional[Interval], Optional[Interval], Optional[Interval]]:
    """The arms' typical iterations, the measured saving, slowdown and energy saved so far."""
    record = view.record
    if comparison is None:
        arms = []
        for arm, steps in (("baseline", record.max_speed), ("plan", record.plan)):
            if steps:
                typical = typical_step(steps)
                arms.append(
                    ArmFigures(
                        arm=arm,
                        iteration_time_s=typical["iteration_time_s"],
                        energy_j=typical["energy_j"],
                        num_steps=len(steps),
                    )
                )
        return tuple(arms), None, None, None
    ref, plan = comparison.reference, comparison.plan
    arms = [
        ArmFigures(
            "baseline", ref["iteration_time_s"], ref["energy_j"], int(ref["num_steps"] or 0)
        ),
        ArmFigures("plan", plan["iteration_time_s"], plan["energy_j"], int(plan["num_steps"] or 0)),
    ]
    saving = slowdown = saved = None
    measurable = comparison.energy_saving_measurable
    if comparison.energy_saving is not None:
        s = comparison.energy_saving
        saving = Interval(s.value if measurable else None, s.low, s.high, measurable)
        ref_j = ref["energy_j"]
        if ref_j:
            per_step_j = ref_j * tel.plan_steps
            saved = Interval(
                s.value * per_step_j if measurable else None,
                s.low * per_step_j,
                s.high * per_step_j,
                measurable,
            )
    if comparison.slowdown is not None:
        d = comparison.slowdown
        slowdown = Interval(d.value, d.low, d.high, not d.contains_zero)
    return tuple(arms), saving, slowdown, saved


def _predicted(result: PlanResult, tel: JobTelemetry) -> Optional[Interval]:
    """The chosen plan's predicted saving with its interval (computed once per plan)."""
    key = ("predicted", id(result), result.chosen.plan_id)
    if tel.memo.get("predicted_key") != key:
        value, low, high = predicted_saving(result)
        tel.memo["predicted_key"] = key
        tel.memo["predicted"] = Interval(
            value, low, high, low is not None and high is not None and not low <= 0.0 <= high
        )
    kept: Optional[Interval] = tel.memo["predicted"]
    return kept


def comparison_intervals(comparison: Comparison) -> Optional[Tuple[int, Interval, Interval]]:
    """``(pairs, saving, slowdown)`` of a measurement with both intervals (else ``None``)."""
    s, d = comparison.energy_saving, comparison.slowdown
    if s is None or d is None:
        return None
    measurable = comparison.energy_saving_measurable
    return (
        comparison.num_pairs,
        Interval(s.value if measurable else None, s.low, s.high, measurable),
        Interval(d.value, d.low, d.high, not d.contains_zero),
    )


def job_detail(view: JobView, tel: JobTelemetry) -> JobDetail:
    """What the page's view of the job draws besides its snapshot."""
    result, epoch = view.result, view.epoch
    frontier: Tuple[FrontierPlan, ...] = ()
    timeline: Tuple[Tuple[TimelineBox, ...], ...] = ()
    timeline_plan = None
    if result is not None:
        in_force = epoch.default.plan_id if epoch is not None else result.chosen.plan_id
        frontier = tuple(
            FrontierPlan(
                plan_id=p.plan_id,
                iteration_time_s=p.iteration_time_s,
                energy_j=p.energy_j,
                is_allmax=bool(p.is_allmax),
                chosen=p.plan_id == result.chosen.plan_id,
                in_force=p.plan_id == in_force,
            )
            for p in _thinned(result, in_force)
        )
        timeline_plan = in_force
        timeline = _timeline(result, in_force, tel)
    gpus = sorted(tel.gpus.values(), key=lambda g: (g.stage, g.rank))[:MAX_POWER_SERIES]
    steps = list(tel.steps)[-STEPS_SHOWN:]
    return JobDetail(
        frontier=frontier,
        timeline=timeline,
        timeline_plan_id=timeline_plan,
        power={g.gpu: list(g.counter.samples) for g in gpus if g.counter.samples},
        steps=tuple(steps),
        savings=tuple(tel.savings),
        phases=tuple(tel.phases),
    )


def _thinned(result: PlanResult, in_force: int) -> List[Any]:
    """The frontier's plans, every one up to :data:`MAX_FRONTIER`, else evenly thinned."""
    points = result.frontier.points
    if len(points) <= MAX_FRONTIER:
        return list(points)
    stride = math.ceil(len(points) / MAX_FRONTIER)
    keep = {result.chosen.plan_id, result.frontier.allmax.plan_id, in_force}
    return [p for i, p in enumerate(points) if i % stride == 0 or p.plan_id in keep]


def _timeline(
    result: PlanResult, plan_id: int, tel: JobTelemetry
) -> Tuple[Tuple[TimelineBox, ...], ...]:
    """The plan's re-simulated timeline per stage (computed once per plan)."""
    key = ("timeline", id(result), plan_id)
    if tel.memo.get("timeline_key") == key:
        kept: Tuple[Tuple[TimelineBox, ...], ...] = tel.memo["timeline"]
        return kept
    from perseus.planner.simulate import simulate

    point = next(p for p in result.frontier.points if p.plan_id == plan_id)
    problem = result.frontier.problem
    sim = simulate(problem, point.freqs)
    stages = []
    for s in range(problem.num_stages):
        boxes = [
            TimelineBox(
                kind=LETTERS.get(name, "?"),
                microbatch=int(mb),
                start_s=float(sim.start_s[s][i]),
                end_s=float(sim.end_s[s][i]),
                frequency_mhz=int(point.freqs[s][i]),
            )
            for i, (name, mb) in enumerate(problem.order[s])
        ]
        stages.append(tuple(_coarsened(boxes)))
    timeline = tuple(stages)
    tel.memo["timeline_key"], tel.memo["timeline"] = key, timeline
    return timeline


def _coarsened(boxes: Sequence[TimelineBox]) -> List[TimelineBox]:
    """At most :data:`MAX_BOXES` boxes: neighbours merged (time-weighted clock) when more."""
    if len(boxes) <= MAX_BOXES:
        return list(boxes)
    size = math.ceil(len(boxes) / MAX_BOXES)
    out = []
    for i in range(0, len(boxes), size):
        group = boxes[i : i + size]
        busy = sum(b.end_s - b.start_s for b in group) or 1.0
        mhz = sum(b.frequency_mhz * (b.end_s - b.start_s) for b in group) / busy
        kinds = {b.kind for b in group}
        out.append(
            TimelineBox(
                kind=kinds.pop() if len(kinds) == 1 else "*",
                microbatch=group[0].microbatch,
                start_s=group[0].start_s,
                end_s=group[-1].end_s,
                frequency_mhz=round(mhz),
            )
        )
    return out


def arm_of(phase: JobPhase, step: int) -> str:
    """What iteration ``step``, completed in ``phase``, ran (see :func:`step_arm`)."""
    arms = getattr(phase, "arms", None)  # the running phase's measurement
    arm = arms.arm(step) if arms is not None else None
    fallback = getattr(phase, "fallback", None) is not None
    return step_arm(phase.name, None if arm is None else str(arm), fallback)


def profiling_progress(
    phase: JobPhase, prof: ProfilerSettings
) -> Tuple[Optional[int], Optional[int], Optional[float]]:
    """Profiling iterations run, the most it may run, and its progress (0 to 1).

    While profiling, the progress is the iterations run over ``profiler.max_iterations`` (the
    phase ends there at the latest), and 1 once every stage's sweep stopped.
    """
    budget = prof.max_iterations
    sweeps = getattr(phase, "sweeps", None) if phase.name == Phase.profiling else None
    if sweeps:
        done = max(s.num_steps for s in sweeps)
        if all(s.done for s in sweeps):
            return done, budget, 1.0
        return done, budget, min(1.0, done / budget)
    if phase.name == Phase.baseline:
        return 0, budget, 0.0
    profiled = phase.outcome().profiling
    if profiled is None:
        return None, budget, None
    iterations = (profiled.summary or {}).get("iterations")
    finished = profiled.last_step is not None
    ratio = 1.0 if finished else min(1.0, (iterations or 0) / budget)
    return iterations, budget, ratio


def step_arm(phase: Phase, running_arm: Optional[str], fallback: bool) -> str:
    """What an iteration ran, for the views: ``baseline`` (max speed), ``plan``, or a phase.

    Args:
        phase: The job's phase when the iteration completed.
        running_arm: In ``running``, the measurement's arm of the step (``max_speed``,
            ``plan``; ``None``: the settling steps, which run the plan).
        fallback: The plan fell back to max speed.
    """
    if phase == Phase.running:
        return "baseline" if running_arm == "max_speed" else "plan"
    if phase == Phase.watching:
        return "baseline" if fallback else "plan"
    if phase == Phase.planning:
        return "baseline"  # max speed while the planner works
    return str(phase)
