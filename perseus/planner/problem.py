"""The planning problem: a profile, a pipeline schedule and the blocking power.

Everything a solver or the re-simulation needs is precomputed here as numpy arrays:

* option tables per *group* ``g = 2 * stage + kind`` (kind 0 = forward, 1 = backward): every
  profiled frequency with its time and energy, fastest first;
* per group, the *candidates*: options on the lower-left frontier of (time, effective energy),
  where effective energy is ``energy - P_block(stage) * time``. Blocking power is paid for every
  second a GPU is not computing, so running an instruction for ``dt`` longer really costs its
  extra energy minus ``P_block * dt``. Any other option is never better in any plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Dict, List, Tuple, Union

import numpy as np

from perseus.errors import ConfigError
from perseus.formats.profile_csv import INSTRUCTIONS, Profile, blocking_power_per_stage_w
from perseus.planner.dag import PipelineDAG, build_dag
from perseus.schedule import stage_order_chunks

#: Per stage, one frequency (MHz) per instruction in execution order.
Freqs = List[List[int]]


class PlanningProblem:
    """One pipeline iteration to plan.

    Attributes:
        profile: The measured profile.
        num_microbatches: Microbatches per iteration.
        num_stages: Pipeline stages (= the profile's stages).
        schedule: Pipeline schedule name.
        p2p_power_w: Blocking power per stage (W).
        order: Per stage, ``(instruction, microbatch)`` in execution order.
        dag: The dependency DAG.
    """

    def __init__(
        self,
        profile: Profile,
        num_microbatches: int,
        p2p_power_w: Union[Sequence[float], float],
        schedule: str = "1f1b",
        num_model_chunks: int = 1,
    ) -> None:
        """Build the schedule, the DAG and the option tables.

        Raises:
            ConfigError: bad sizes or schedule; ProfileError for a bad ``p2p_power_w``.
        """
        self.profile = profile
        self.num_microbatches = int(num_microbatches)
        self.num_stages = profile.num_stages
        self.schedule = schedule
        self.num_model_chunks = int(num_model_chunks)
        self.p2p_power_w: List[float] = blocking_power_per_stage_w(p2p_power_w, self.num_stages)
        chunks = stage_order_chunks(
            schedule, self.num_stages, self.num_microbatches, self.num_model_chunks
        )
        self.order_chunks = chunks
        self.order: List[List[Tuple[str, int]]] = [[(n, m) for n, m, _ in st] for st in chunks]
        self.dag: PipelineDAG = build_dag(chunks)
        self._build_tables()

    # -- tables -----------------------------------------------------------------------------
    def _build_tables(self) -> None:
        groups = [(s, name) for s in range(self.num_stages) for name in INSTRUCTIONS]
        tables = [self.profile.measurements(s, name) for s, name in groups]
        tables = [sorted(ms, key=lambda m: (m.time_s, -m.frequency_mhz)) for ms in tables]
        width = max(len(t) for t in tables)
        num_groups = len(groups)
        self.opt_freq = np.zeros((num_groups, width), dtype=np.int64)
        self.opt_time = np.full((num_groups, width), np.inf)
        self.opt_energy = np.full((num_groups, width), np.inf)
        self.num_options = np.array([len(t) for t in tables], dtype=np.int64)
        self._freq_index: List[Dict[int, int]] = []
        for g, ms in enumerate(tables):
            for k, m in enumerate(ms):
                self.opt_freq[g, k] = m.frequency_mhz
                self.opt_time[g, k] = m.time_s
                self.opt_energy[g, k] = m.energy_j
            self._freq_index.append({m.frequency_mhz: k for k, m in enumerate(ms)})
        power = np.repeat(np.asarray(self.p2p_power_w), 2)[:, None]
        finite = np.isfinite(self.opt_time)
        self.opt_effective = np.where(
            finite, self.opt_energy - power * np.where(finite, self.opt_time, 0.0), np.inf
        )
        self.candidates: List[np.ndarray] = [
            _lower_left(self.opt_time[g, :n], self.opt_effective[g, :n])
            for g, n in enumerate(self.num_options.tolist())
        ]
        # The highest frequency of each group (the all-max plan's choice).
        self.max_option = np.array(
            [int(np.argmax(self.opt_freq[g, :n])) for g, n in enumerate(self.num_options)],
            dtype=np.int64,
        )
        self.node_group = 2 * self.dag.stage + self.dag.kind

    # -- conversions ------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Instructions per iteration."""
        return self.dag.num_nodes

    def choices_to_freqs(self, choices: np.ndarray) -> Freqs:
        """Per-node option indices to per-stage frequencies (MHz) in execution order."""
        flat = self.opt_freq[self.node_group, choices]
        off = self.dag.offsets
        return [flat[off[s] : off[s + 1]].tolist() for s in range(self.num_stages)]

    def freqs_to_choices(self, freqs: Freqs) -> np.ndarray:
        """Per-stage frequencies to per-node option indices.

        Raises:
            ConfigError: wrong shape, or a frequency that was not profiled for that instruction.
        """
        if len(freqs) != self.num_stages:
            raise ConfigError(f"plan has {len(freqs)} stages, the problem has {self.num_stages}")
        out = np.empty(self.num_nodes, dtype=np.int64)
        for s, stage_freqs in enumerate(freqs):
            lo, hi = int(self.dag.offsets[s]), int(self.dag.offsets[s + 1])
            if len(stage_freqs) != hi - lo:
                raise ConfigError(
                    f"stage {s} of the plan has {len(stage_freqs)} instructions, the "
                    f"{self.schedule} schedule has {hi - lo}"
                )
            for i, f in enumerate(stage_freqs):
                g = int(self.node_group[lo + i])
                try:
                    out[lo + i] = self._freq_index[g][int(f)]
                except KeyError:
                    name = INSTRUCTIONS[g % 2]
                    raise ConfigError(
                        f"stage {s} {name} (position {i}): {f} MHz was not profiled; "
                        f"profiled: {sorted(self._freq_index[g])}"
                    ) from None
        return out

    def allmax_choices(self) -> np.ndarray:
        """Every instruction at its highest profiled frequency."""
        return self.max_option[self.node_group].copy()

    def allmax_freqs(self) -> Freqs:
        """The all-max plan as per-stage frequencies."""
        return self.choices_to_freqs(self.allmax_choices())


def _lower_left(time_s: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of options not dominated in (time, cost), time ascending, cost descending."""
    order = np.lexsort((cost, time_s))
    keep: List[int] = []
    best = np.inf
    for k in order.tolist():
        if cost[k] < best:
            keep.append(k)
            best = cost[k]
    return np.asarray(keep, dtype=np.int64)
