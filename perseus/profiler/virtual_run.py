"""The real emulated GPU on a virtual clock, measured the way the product measures it.

No sleeping and no host jitter: iterations run as fast as the machine computes them, and the
outcome does not depend on how busy it is. The GPU's energy is measured by the product's own
sampler (:class:`perseus.gpu.energy.sampler.EnergySampler`) polling the emulated counter on the
virtual clock as its thread would (:func:`attach_sampler`); the hooks only stamp times. The
profiler's accuracy benchmark (``scripts/online_profiling_accuracy.py``) and its tests drive
profiles through this.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from perseus.formats.profile.table import Measurement, Profile, read_profile_csv
from perseus.gpu.base import GPU
from perseus.gpu.emulated.device import EmulatedGPU, default_device_profile_path
from perseus.gpu.energy.meter import EnergyMeter
from perseus.gpu.energy.sampler import EnergySampler
from perseus.profiler.estimation.job_estimates import JobEstimates
from perseus.profiler.job_profiler import JobProfiler
from perseus.profiler.sweep.stage import StageSweep, sweep_clocks_mhz
from perseus.records import InstructionRecord, StepRecord
from perseus.schedule import stage_order

# Where :func:`realistic_gpus`' clocks start (stage s and seed n: plus 0.0137 s + 0.0071 n s).
CLOCK_START_S = 1000.0
# A poller: called at a virtual instant, returns the seconds until it wants to run again.
Poller = Callable[[], float]


class VirtualClock:
    """A clock that only moves when someone sleeps on it.

    Pollers (:meth:`add_poller`) run at their instants while the clock sleeps through them,
    as a background thread would have run then (a poller that sleeps itself does not run
    pollers meanwhile).

    Args:
        start_s: The first reading (seconds).
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self._pollers: List[List] = []  # [next instant, poller]
        self._polling = False

    def __call__(self) -> float:
        """The current time (seconds)."""
        return self.now_s

    def add_poller(self, poller: Poller, first_in_s: float = 0.0) -> None:
        """Run ``poller`` ``first_in_s`` from now, then whenever it asks to."""
        self._pollers.append([self.now_s + max(0.0, first_in_s), poller])

    def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` (negative: not at all), running due pollers."""
        end_s = self.now_s + max(0.0, seconds)
        if self._polling or not self._pollers:
            self.now_s = end_s
            return
        self._polling = True
        try:
            while True:
                entry = min(self._pollers, key=lambda e: e[0])
                if entry[0] > end_s:
                    break
                self.now_s = max(self.now_s, entry[0])
                entry[0] = self.now_s + max(1e-6, entry[1]())
        finally:
            self._polling = False
        self.now_s = max(self.now_s, end_s)


def attach_sampler(gpu: GPU, clock: VirtualClock) -> EnergySampler:
    """The product's energy sampler of ``gpu``, polling on ``clock`` as its thread would."""
    sampler = EnergySampler(gpu.total_energy_mj, clock, name=f"virtual-{gpu.index}")

    def poll() -> float:
        sampler.poll_once()
        return sampler.next_read_in_s(clock())

    clock.add_poller(poll)
    return sampler


def attach_meter(gpus: Sequence[GPU], clock: VirtualClock) -> EnergyMeter:
    """An energy meter of ``gpus`` whose samplers poll on ``clock`` as their threads would."""
    samplers = [attach_sampler(gpu, clock) for gpu in gpus]
    return EnergyMeter(samplers, clock, sleeper=clock.sleep)


def virtual_gpu(
    num_stages: int,
    *,
    time_scale: float = 0.1,
    noise: float = 0.01,
    period_s: float = 0.02,
    seed: int = 0,
) -> Tuple[EmulatedGPU, VirtualClock]:
    """The bundled default device on its own virtual clock (``seed`` offsets the clock)."""
    clock = VirtualClock(1000.0 + 0.0137 * seed)
    gpu = EmulatedGPU(
        read_profile_csv(default_device_profile_path()),
        blocking_power_w=83.64,
        time_scale=time_scale,
        energy_update_period_s=period_s,
        energy_noise=noise,
        seed=seed,
        num_pipeline_stages=num_stages,
        clock=clock,
        sleeper=clock.sleep,
    )
    return gpu, clock


def realistic_gpus(
    num_stages: int, *, instruction_s: float = 0.05, seed: int = 0
) -> List[Tuple[EmulatedGPU, VirtualClock]]:
    """One realistic emulated GPU per stage (the recorded H100's counter), each on its clock.

    The bundled default device with every time scaled so that its forward at the highest
    clock lasts ``instruction_s`` (its backward about twice that); ``seed`` offsets the
    clocks and seeds each GPU's readings.
    """
    time_scale = instruction_s / _forward_s(read_profile_csv(default_device_profile_path()))
    out = []
    for stage in range(num_stages):
        clock = VirtualClock(CLOCK_START_S + 0.0137 * stage + 0.0071 * seed)
        gpu = EmulatedGPU(
            read_profile_csv(default_device_profile_path()),
            blocking_power_w=83.64,
            time_scale=time_scale,
            counter="realistic",
            seed=stage + 100 * seed,
            num_pipeline_stages=num_stages,
            clock=clock,
            sleeper=clock.sleep,
        )
        out.append((gpu, clock))
    return out


def _forward_s(profile: Profile) -> float:
    """The first stage's forward at its highest clock (s)."""
    return max(profile.measurements(0, "forward"), key=lambda m: m.frequency_mhz).time_s


def run_step(
    gpu: EmulatedGPU,
    clock: VirtualClock,
    stage: int,
    order: Sequence[Tuple[str, int]],
    freqs: Sequence[Optional[int]],
    rng: random.Random,
    mean_gap_s: float,
    overrun_p: float = 0.0,
) -> List[InstructionRecord]:
    """The instruction records of :func:`run_step_record`."""
    return run_step_record(
        gpu, clock, stage, 0, order, freqs, rng, mean_gap_s, overrun_p
    ).instructions


def run_step_record(
    gpu: EmulatedGPU,
    clock: VirtualClock,
    stage: int,
    step: int,
    order: Sequence[Tuple[str, int]],
    freqs: Sequence[Optional[int]],
    rng: random.Random,
    mean_gap_s: float,
    overrun_p: float = 0.0,
) -> StepRecord:
    """One iteration of one stage alone: random blocking gaps, then each instruction.

    The time between iterations (optimizer step etc.) comes before the iteration's start. The
    stage never waits for its neighbours (profiling accuracy, load generation); use
    :func:`run_pipeline_step` where the pipeline's dependencies matter. With ``overrun_p``, that
    fraction of instructions overrun: the host ran 2-10 ms late and the GPU waited (host jitter).
    """
    clock.sleep(mean_gap_s * 3)  # between iterations (optimizer step etc.)
    start_s = clock()
    out = []
    for pos, ((instruction, mb), freq) in enumerate(zip(order, freqs)):
        clock.sleep(mean_gap_s * 2 * rng.random())
        out.append(_run_instruction(gpu, clock, stage, pos, instruction, mb, freq, rng, overrun_p))
    clock.sleep(mean_gap_s * rng.random())
    return StepRecord(
        step=step, stage=stage, start_s=start_s, end_s=clock(), energy_j=None, instructions=out
    )


def run_pipeline_step(
    replica: Sequence[Tuple[EmulatedGPU, VirtualClock]],
    orders: Sequence[Sequence[Tuple[str, int]]],
    freqs: Sequence[Sequence[Optional[int]]],
    rng: random.Random,
    mean_gap_s: float,
) -> List[List[InstructionRecord]]:
    """One iteration of one pipeline replica, stages waiting for each other.

    Every stage starts the iteration together (the previous optimizer step synchronized them);
    a forward waits for the previous stage's forward of the same microbatch, a backward for the
    next stage's backward, so lighter stages idle at the blocking power like real ones.

    Args:
        replica: ``(gpu, clock)`` of every stage, in stage order.
        orders: Every stage's instruction order.
        freqs: Every stage's clock per instruction position (``None``: default clocks).
        rng: Draws the host's gaps.
        mean_gap_s: Mean host gap before an instruction.

    Returns:
        Every stage's instruction records.
    """
    start_s = max(clock() for _, clock in replica)
    for _, clock in replica:
        clock.sleep(start_s - clock() + mean_gap_s * 3)
    ended_s: Dict[Tuple[int, str, int], float] = {}
    records: List[List[InstructionRecord]] = [[] for _ in replica]
    last = len(replica) - 1
    while any(len(records[s]) < len(orders[s]) for s in range(len(replica))):
        progressed = False
        for stage, (gpu, clock) in enumerate(replica):
            while len(records[stage]) < len(orders[stage]):
                pos = len(records[stage])
                instruction, mb = orders[stage][pos]
                if instruction == "forward" and stage > 0:
                    needs: Optional[Tuple[int, str, int]] = (stage - 1, "forward", mb)
                elif instruction == "backward" and stage < last:
                    needs = (stage + 1, "backward", mb)
                else:
                    needs = None
                if needs is not None:
                    if needs not in ended_s:
                        break
                    clock.sleep(ended_s[needs] - clock())  # idle until the input arrives
                clock.sleep(mean_gap_s * 2 * rng.random())
                record = _run_instruction(
                    gpu, clock, stage, pos, instruction, mb, freqs[stage][pos], rng, 0.0
                )
                records[stage].append(record)
                ended_s[(stage, instruction, mb)] = record.end_s
                progressed = True
        if not progressed:
            raise ValueError("the stages' instruction orders deadlock; is this a valid schedule?")
    return records


def _run_instruction(
    gpu: EmulatedGPU,
    clock: VirtualClock,
    stage: int,
    pos: int,
    instruction: str,
    mb: int,
    freq: Optional[int],
    rng: random.Random,
    overrun_p: float,
) -> InstructionRecord:
    if freq is None:
        gpu.reset_sm_clocks()
    else:
        gpu.lock_sm_clocks_mhz(freq, freq)
    gpu.instruction_begin(stage, instruction)
    t0 = clock()
    if overrun_p and rng.random() < overrun_p:
        clock.sleep(0.002 + 0.008 * rng.random())
    gpu.instruction_end(instruction)
    return InstructionRecord(
        position=pos,
        instruction=instruction,
        microbatch=mb,
        frequency_mhz=freq,
        start_s=t0,
        end_s=clock(),
    )


def profile_errors(
    profile: Profile, truth: Callable[[int, str, int], Measurement]
) -> Tuple[List[float], List[float]]:
    """Relative time and energy errors of every row of ``profile`` against ``truth``.

    Args:
        profile: A measured profile.
        truth: ``(stage, instruction, frequency_mhz) -> Measurement``, e.g. an emulated GPU's
            ``true_measurement``.
    """
    time_err, energy_err = [], []
    for stage in profile.stages():
        for instruction in ("forward", "backward"):
            for m in profile.measurements(stage, instruction):
                true = truth(stage, instruction, m.frequency_mhz)
                time_err.append(abs(m.time_s / true.time_s - 1))
                energy_err.append(abs(m.energy_j / true.energy_j - 1))
    return time_err, energy_err


def profile_virtually(
    gpus: Sequence[Tuple[EmulatedGPU, VirtualClock]],
    orders: Sequence[Sequence[Tuple[str, int]]],
    make_sweep: Callable[[int, Optional[float], Optional[float]], StageSweep],
    *,
    max_steps: int,
    rng: random.Random,
    mean_gap_s: float,
    overrun_p: float = 0.0,
    reference_steps: int = 3,
    power_limits_w: Optional[Sequence[float]] = None,
) -> JobProfiler:
    """Profile a job on emulated GPUs the way the coordination server does.

    Each GPU's energy is measured by its own sampler (:func:`attach_sampler`); its updates
    reach the estimator with each iteration's stamps. ``reference_steps`` iterations at the
    highest clock come first (the server's baseline), then every stage's sweep is made by
    ``make_sweep(stage, update_period_s, equation_noise)`` from what the baseline measured,
    and the sweeps run until done or ``max_steps`` profiling iterations. ``power_limits_w``:
    each GPU's power limit as the server passes it (default: none; the bundled emulated
    profiles hold rows above the emulated device's nominal 400 W limit).
    """
    samplers = [attach_sampler(gpu, clock) for gpu, clock in gpus]
    cursors = [0] * len(gpus)
    estimates = JobEstimates(len(gpus))
    for stage, limit_w in enumerate(power_limits_w or [None] * len(gpus)):
        estimates.set_gpu(stage, stage, power_limit_w=limit_w)

    def run(stage: int, step: int, freqs: Sequence[Optional[int]]) -> StepRecord:
        gpu, clock = gpus[stage]
        rec = run_step_record(
            gpu, clock, stage, step, orders[stage], freqs, rng, mean_gap_s, overrun_p
        )
        updates, cursors[stage] = samplers[stage].series.since(cursors[stage])
        estimates.add_updates(stage, stage, updates)
        return rec

    for step in range(reference_steps):
        for stage, (gpu, _) in enumerate(gpus):
            top = max(gpu.supported_sm_clocks_mhz())
            rec = run(stage, step - reference_steps, [top] * len(orders[stage]))
            estimates.add_step(
                stage,
                stage,
                rec.instructions,
                step=rec.step,
                step_start_s=rec.start_s,
                step_end_s=rec.end_s,
            )
    sweeps = [
        make_sweep(s, estimates.update_period_s(s), estimates.equation_noise(s))
        for s in range(len(gpus))
    ]
    job = JobProfiler(sweeps, estimates)
    step = 0
    while not job.done and step < max_steps:
        for stage in range(len(gpus)):
            rec = run(stage, step, job.schedule(stage, step))
            job.add_report(stage, stage, step, rec.instructions, rec.start_s, rec.end_s)
            job.complete_step(stage, step)
        step += 1
        if step >= max_steps:
            job.finish()
    return job


def profile_realistic(
    instruction_s: float,
    num_stages: int,
    num_microbatches: int,
    *,
    frequency_step: int,
    budget: int,
    seed: int = 0,
) -> Tuple[JobProfiler, List[Tuple[EmulatedGPU, VirtualClock]]]:
    """A 1F1B job profiled on :func:`realistic_gpus` until its rows reach the 2 % target.

    Every ``frequency_step``-th clock is swept; ``budget`` iterations at most (a budget that
    does not bind shows what the target alone costs).
    """
    gpus = realistic_gpus(num_stages, instruction_s=instruction_s, seed=seed)
    orders = stage_order("1f1b", num_stages, num_microbatches)
    times = {"forward": instruction_s, "backward": 1.9 * instruction_s}

    def make_sweep(stage: int, period_s: Optional[float], noise: Optional[float]) -> StageSweep:
        supported = gpus[stage][0].supported_sm_clocks_mhz()
        return StageSweep(
            orders[stage],
            sweep_clocks_mhz(supported, frequency_step=frequency_step),
            instruction_time_s=times,
            max_steps=budget,
            update_period_s=period_s,
            equation_noise=noise,
        )

    rng, gap_s = random.Random(seed), 0.04 * instruction_s  # host gaps scale with the work
    job = profile_virtually(gpus, orders, make_sweep, max_steps=budget, rng=rng, mean_gap_s=gap_s)
    return job, gpus
