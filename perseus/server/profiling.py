"""Setting up a job's online profiler from its spec and its baseline iterations."""

from __future__ import annotations

import statistics
from typing import Dict, List, Sequence, Tuple

from perseus.profiler import JobProfiler, StageSweep, sweep_clocks_mhz
from perseus.wire import ProfilerSettings


def make_profiler(
    prof: ProfilerSettings,
    orders: Sequence[Sequence[Tuple[str, int]]],
    stage_clocks_mhz: Sequence[List[int]],
    kind_times_s: Dict[Tuple[int, str], List[float]],
) -> JobProfiler:
    """One frequency sweep per stage, sized by the instruction times the baseline measured.

    Args:
        prof: The job's profiler settings.
        orders: Each stage's instruction order in one iteration.
        stage_clocks_mhz: Each stage's supported SM clocks, highest first.
        kind_times_s: ``(stage, instruction) -> durations`` measured in the baseline.
    """
    sweeps = []
    for stage, order in enumerate(orders):
        times = {
            kind: statistics.median(v) for (s, kind), v in kind_times_s.items() if s == stage and v
        }
        clocks = sweep_clocks_mhz(
            stage_clocks_mhz[stage], prof.min_frequency_mhz, prof.frequency_step
        )
        sweeps.append(
            StageSweep(
                order,
                clocks,
                mode=prof.mode,
                patience=prof.energy_rise_patience,
                warmup_instructions=prof.warmup_instructions,
                min_window_s=prof.min_window_s,
                instruction_time_s=times,
                max_steps=prof.max_iterations,
            )
        )
    return JobProfiler(sweeps)
