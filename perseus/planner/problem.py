"""The planning problem: a profile, a pipeline schedule and the blocking power.

Everything a solver or the re-simulation needs is precomputed here as numpy arrays:

* option tables per *group* ``g = K * stage + k``: ``k`` the position of the instruction's kind
  among the ``K`` kinds the schedule uses (:attr:`PlanningProblem.kinds`; forward and
  backward: ``g = 2 * stage + kind``, kind 0 = forward, 1 = backward): every profiled
  frequency with its time and energy, fastest first;
* per group, the *candidates*: options on the lower-left frontier of (time, effective energy),
  where effective energy is ``energy - P_block(stage) * time``. Blocking power is paid for every
  second a GPU is not computing, so running an instruction for ``dt`` longer really costs its
  extra energy minus ``P_block * dt``. Any other option is never better in any plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Dict, List, Tuple, Union

import numpy as np

from perseus.errors import ConfigError, ProfileError
from perseus.formats.profile.table import Profile, blocking_power_per_stage_w
from perseus.pipeline_order import KINDS, PipelineOrder
from perseus.planner.dag import PipelineDAG, build_dag
from perseus.schedule import SCHEDULES, ScheduleLike, pipeline_order, schedule_name

#: Per stage, one frequency (MHz) per instruction in execution order.
Freqs = List[List[int]]


class PlanningProblem:
    """One pipeline iteration to plan.

    Attributes:
        profile: The measured profile.
        num_microbatches: Microbatches per iteration.
        num_stages: Pipeline stages (= the profile's stages; a rank's model chunks share them).
        schedule: Pipeline schedule name.
        pipeline_order: The schedule's actions (generated, or the engine's own).
        kinds: The instruction kinds the schedule uses (forward first).
        p2p_power_w: Blocking power per stage (W).
        order: Per stage, ``(instruction, microbatch)`` in execution order.
        dag: The dependency DAG.
    """

    def __init__(
        self,
        profile: Profile,
        num_microbatches: int,
        p2p_power_w: Union[Sequence[float], float],
        schedule: ScheduleLike = "1f1b",
        num_model_chunks: int = 1,
    ) -> None:
        """Build the schedule, the DAG and the option tables.

        Args:
            profile: Per stage and instruction kind, time and energy at every clock.
            num_microbatches: Microbatches per iteration.
            p2p_power_w: Blocking power, one value or one per stage (W).
            schedule: A schedule Perseus generates (``1f1b``, ``gpipe``, ``interleaved_1f1b``)
                or the engine's own order (:class:`~perseus.pipeline_order.PipelineOrder`).
            num_model_chunks: Model chunks per stage (``interleaved_1f1b``).

        Raises:
            ConfigError: bad sizes or schedule; ProfileError for a bad ``p2p_power_w``, or a
                profile without rows for a kind the schedule runs.
        """
        self.profile = profile
        self.num_microbatches = int(num_microbatches)
        self.num_stages = profile.num_stages
        self.p2p_power_w: List[float] = blocking_power_per_stage_w(p2p_power_w, self.num_stages)
        order = pipeline_order(schedule, self.num_stages, self.num_microbatches, num_model_chunks)
        self.pipeline_order: PipelineOrder = order
        self.schedule = schedule_name(schedule)
        self.num_model_chunks = order.num_model_chunks
        self.kinds: Tuple[str, ...] = order.kinds()
        chunks = order.chunks()
        self.order_chunks = chunks
        self.order: List[List[Tuple[str, int]]] = [[(n, m) for n, m, _ in st] for st in chunks]
        self.dag: PipelineDAG = build_dag(order)
        # Whether Perseus generates this order from the schedule's name (an engine's order
        # counts when its actions are the same): plans then need not list pipeline stages, and
        # the lp solver's steady-state phases are made for the generated 1F1B.
        self.is_generated = _is_generated(order, self.num_stages, self.num_microbatches)
        self.is_generated_1f1b = self.is_generated and self.schedule == "1f1b"
        self._build_tables()

    def group_kind(self, group: int) -> str:
        """The instruction kind of option group ``group``."""
        return self.kinds[group % len(self.kinds)]

    # -- tables -----------------------------------------------------------------------------
    def _build_tables(self) -> None:
        groups = [(s, name) for s in range(self.num_stages) for name in self.kinds]
        missing = [(s, name) for s, name in groups if not self.profile.has(s, name)]
        if missing:
            s, name = missing[0]
            raise ProfileError(
                f"{self.profile.source}: the {self.schedule} schedule runs {name} "
                f"instructions but stage {s} has no {name} rows; profile this schedule "
                "(its run measures every kind it runs), or derive them from the backward "
                "(perseus.formats.profile.split.split_backward; docs/design.md, 'Profile CSV')"
            )
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
        power = np.repeat(np.asarray(self.p2p_power_w), len(self.kinds))[:, None]
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
        position = np.full(len(KINDS), -1, dtype=np.int64)
        for k, name in enumerate(self.kinds):
            position[KINDS.index(name)] = k
        self.node_group = len(self.kinds) * self.dag.stage + position[self.dag.kind]

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
                    name = self.group_kind(g)
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


def _is_generated(order: PipelineOrder, num_stages: int, num_microbatches: int) -> bool:
    if order.name not in SCHEDULES:
        return False
    try:
        generated = pipeline_order(order.name, num_stages, num_microbatches, order.num_model_chunks)
    except ConfigError:
        return False
    return generated == order


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
