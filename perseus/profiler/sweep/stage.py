"""Which frequency every instruction of one stage runs at while that stage is profiled.

Two modes (``profiler.mode``):

* ``sweep`` — one window per instruction kind per iteration: every forward of the iteration runs
  at the forward's current frequency, every backward at the backward's; each kind walks down the
  clock list on its own and stops on its own.
* ``fast`` — the kinds sweep together and one iteration carries several frequencies: the
  stage's instruction order is cut into contiguous blocks (each holding enough instructions of
  every kind, and lasting at least ``min_window_s`` and the budget's share of one clock), and
  consecutive blocks take consecutive clocks, high to low; the kinds after the forward lag half
  a block behind (see ``StageSweep._assign_fast``). Iterations left in the budget once the stop
  rule ended every kind re-measure the swept clocks whose rows are still uncertain, in passes
  that alternate direction: up from the lowest, then down again
  (:func:`~perseus.profiler.sweep.windows.pass_order`), so that a drift over the profiling (the
  GPU warming up) does not line up with the clocks.

The kinds are those the stage's order runs: forward and backward, or for schedules that split
the backward, its halves ``backward_input`` and ``backward_weight`` (each swept and stopped on
its own, like the backward).

The first ``warmup_instructions`` instructions after a clock change are left out of the time
averages: in ``fast`` mode the first ones of each block, in ``sweep`` mode the first ones of each
kind in the iteration (forwards and backwards alternate there, so "after a change" would be every
instruction).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from perseus.pipeline_order import KINDS
from perseus.profiler.sweep.stop import EnergyRiseStop
from perseus.profiler.sweep.windows import (
    blocks,
    pass_order,
    warmup_positions,
    window_s,
)

__all__ = ["StageSweep", "pass_order", "sweep_clocks_mhz", "warmup_positions"]
# Share of the iteration budget the first pass over all clocks is sized to (fast mode).
SWEEP_SHARE = 0.75


def sweep_clocks_mhz(
    supported_mhz: Sequence[int], min_frequency_mhz: Optional[int] = None, frequency_step: int = 1
) -> List[int]:
    """The clocks to sweep, highest first: every ``frequency_step``-th supported clock.

    Args:
        supported_mhz: Clocks the GPUs of the stage all support.
        min_frequency_mhz: Lowest clock to try; ``None`` = no bound.
        frequency_step: Take every n-th clock (1 = all).
    """
    clocks = sorted({int(c) for c in supported_mhz}, reverse=True)
    if min_frequency_mhz is not None:
        clocks = [c for c in clocks if c >= min_frequency_mhz] or clocks[:1]
    return clocks[:: max(1, int(frequency_step))]


class StageSweep:
    """The sweep state of one pipeline stage.

    Args:
        order: The stage's ``(instruction, microbatch)`` in execution order.
        clocks_mhz: Clocks to sweep, highest first (see :func:`sweep_clocks_mhz`).
        mode: ``"fast"`` or ``"sweep"``.
        patience: Stop rule: consecutive energy rises that end the sweep of a kind.
        warmup_instructions: Instructions after a clock change left out of time averages.
        min_window_s: Shortest block in ``fast`` mode (enough counter updates).
        instruction_time_s: Rough duration per kind at the highest clock (sizes the blocks).
        min_per_kind: Least forwards and backwards a ``fast`` block holds after warm-up.
        max_steps: The iteration budget (``profiler.max_iterations``); ``None`` = unbounded.
            In ``fast`` mode it sizes the windows (blocks last at least the time that spreads
            :data:`SWEEP_SHARE` of the budget over the clocks, so short instructions are
            aggregated into longer windows) and, once every kind stopped, the iterations left
            re-measure the swept clocks whose rows are still uncertain (each extra window adds
            counter equations; which clocks: :meth:`prioritize`, else every swept one; in
            passes of alternating direction, see :func:`pass_order`).
        update_period_s: The energy counter's measured update period: a window spans at least
            the counter intervals its rows need (:func:`~perseus.profiler.sweep.windows.
            window_s`), over several iterations where one is shorter.
        equation_noise: Relative noise of one counter equation, as measured (default: an
            assumption, see :data:`~perseus.profiler.sweep.windows.DEFAULT_EQUATION_NOISE`).
    """

    def __init__(
        self,
        order: Sequence[Tuple[str, int]],
        clocks_mhz: Sequence[int],
        *,
        mode: str = "fast",
        patience: int = 5,
        warmup_instructions: int = 2,
        min_window_s: float = 0.0,
        instruction_time_s: Optional[Dict[str, float]] = None,
        min_per_kind: int = 2,
        max_steps: Optional[int] = None,
        update_period_s: Optional[float] = None,
        equation_noise: Optional[float] = None,
    ) -> None:
        if mode not in ("fast", "sweep"):
            raise ValueError(f"profiler.mode={mode!r}: choose 'fast' or 'sweep'")
        if not clocks_mhz:
            raise ValueError("no clocks to sweep")
        self.order = [(str(i), int(m)) for i, m in order]
        used = {i for i, _ in self.order}
        self.kinds = tuple(k for k in KINDS if k in used) or KINDS[:2]
        self.clocks_mhz = list(clocks_mhz)
        self.mode = mode
        self.warmup_instructions = max(0, int(warmup_instructions))
        self._stop = {kind: EnergyRiseStop(patience) for kind in self.kinds}
        self.stopped_at: Dict[str, Optional[int]] = {kind: None for kind in self.kinds}
        self._cursor = {kind: 0 for kind in self.kinds}  # next clock index per kind (fast: shared)
        self._finished = False
        times = instruction_time_s or {}
        self.max_steps = max_steps
        step_s = sum(times.get(i, 0.0) for i, _ in self.order)
        counter_s = window_s(update_period_s, equation_noise)
        if max_steps and step_s > 0:
            budget_s = step_s * SWEEP_SHARE * max_steps / len(self.clocks_mhz)
            min_window_s = max(min_window_s, min(budget_s, step_s))
        # Iterations one window lasts: as many as the counter needs, as the budget allows.
        self.steps_per_window = 1
        if step_s > 0 and counter_s > step_s:
            self.steps_per_window = math.ceil(counter_s / step_s)
            if max_steps:
                affordable = int(SWEEP_SHARE * max_steps / len(self.clocks_mhz))
                self.steps_per_window = max(1, min(self.steps_per_window, affordable))
        min_window_s = max(min_window_s, min(counter_s, step_s))
        self.min_window_s = min_window_s
        self._window_left = 0  # iterations the current window still runs
        self._window_freqs: List[int] = []
        self._blocks = blocks(
            self.order, self.kinds, self.warmup_instructions, min_per_kind, min_window_s, times
        )
        self._refine: List[int] = []  # clocks left in the current re-measurement pass
        self._ascending = False  # direction of that pass (the first pass walked down)
        self.refine_priority: Optional[List[int]] = None
        self._refining = False
        self._lag_clock = self.clocks_mhz[0]
        self.assigned: Dict[int, List[int]] = {}
        self.warmup: Dict[int, List[int]] = {}
        self._pending: set = set()
        # Assignments whose step was lost (it ran without them): given to the next steps.
        self._retry: List[List[int]] = []

    # -- assignment -----------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """No clock is left to assign.

        Every kind stopped or reached the lowest clock, and no re-measurement is due (budget
        spent, ``max_steps`` unset, or :meth:`finish` called).
        """
        if self._retry and not self._finished:
            return False
        if not all(self._kind_finished(kind) for kind in self.kinds):
            return False
        if self.mode != "fast" or self.max_steps is None or self._finished:
            return self._window_left == 0 or self._finished
        return len(self.assigned) >= self.max_steps

    @property
    def swept_mhz(self) -> List[int]:
        """Clocks assigned so far, highest first."""
        return self.clocks_mhz[: max(self._cursor.values())]

    def _kind_finished(self, kind: str) -> bool:
        return self.stopped_at[kind] is not None or self._cursor[kind] >= len(self.clocks_mhz)

    def frequencies_for_step(self, step: int) -> List[int]:
        """Frequencies of every position of ``step`` (computed once, then repeated).

        A window longer than one iteration runs the same clocks for :attr:`steps_per_window`
        consecutive iterations.
        """
        if step not in self.assigned:
            if self._retry:
                freqs = self._retry.pop(0)
            elif self._window_left > 0 and not self._finished:
                self._window_left -= 1
                freqs = list(self._window_freqs)
            else:
                freqs = self._assign_fast() if self.mode == "fast" else self._assign_sweep()
                self._window_freqs = list(freqs)
                self._window_left = self.steps_per_window - 1
            self.assigned[step] = freqs
            self.warmup[step] = self._warmup_positions(freqs)
            self._pending.add(step)
        return self.assigned[step]

    def lost(self, step: int) -> bool:
        """``step`` did not run its assignment (no schedule in time, a restart): retry it.

        The step's clocks go to the next step assigned; the lost step no longer counts
        (late reports of it are ignored). Returns whether ``step`` was a pending assignment.
        """
        if step not in self._pending:
            return False
        self._pending.discard(step)
        self._retry.append(self.assigned.pop(step))
        self.warmup.pop(step, None)
        return True

    @property
    def retrying(self) -> bool:
        """Lost assignments wait to be given again."""
        return bool(self._retry)

    def _next_clock(self, kinds: Sequence[str]) -> int:
        index = max(self._cursor[k] for k in kinds)
        if index >= len(self.clocks_mhz):
            return self.clocks_mhz[0]
        for k in kinds:
            self._cursor[k] = index + 1
        return self.clocks_mhz[index]

    def _assign_fast(self) -> List[int]:
        """Forwards take their block's clock; the other kinds lag by half a block.

        The first half of a block's backwards (of each later kind) still run at the previous
        block's clock (the previous iteration's last one, or the highest at the start). Every
        clock thus meets two different partner clocks, which ties the forward/backward split
        of neighbouring clocks together in the counter equations: with short instructions
        alternating at about the counter's update period, a split measured at one clock alone
        is badly conditioned.
        """
        freqs: List[int] = []
        for begin, end in self._blocks:
            live = [k for k in self.kinds if not self._kind_finished(k)]
            clock = self._next_clock(live) if live else self._next_refine()
            lagging = set()
            for kind in self.kinds[1:]:
                of_kind = [p for p in range(begin, end) if self.order[p][0] == kind]
                lagging.update(of_kind[: len(of_kind) // 2])
            for pos in range(begin, end):
                freqs.append(self._lag_clock if pos in lagging else clock)
            self._lag_clock = clock
        return freqs

    def _next_refine(self) -> int:
        """The next clock of the current re-measurement pass; a new pass, the other way."""
        if not self._refine:
            self._ascending = not self._ascending
            wanted = self.refine_priority if self.refine_priority else self.swept_mhz
            self._refine = pass_order(wanted, self._ascending) or self.clocks_mhz[:1]
        return self._refine.pop(0)

    def prioritize(self, clocks_mhz: Sequence[int]) -> None:
        """Re-measure only these clocks (the ones whose rows are still uncertain).

        Called again whenever the estimates change: a clock that became certain leaves the
        current pass, one that became uncertain again waits for the next pass. An empty list
        once the first pass is over (:attr:`refining`) means every row is certain enough:
        nothing is re-measured any more.
        """
        self.refine_priority = [int(c) for c in clocks_mhz]
        wanted = set(self.refine_priority)
        self._refine = [c for c in self._refine if c in wanted]
        if not self.refine_priority and self.refining:
            self._finished = True
            self._retry = []

    @property
    def refining(self) -> bool:
        """Every kind finished its first pass (stopped, or reached the lowest clock).

        The windows left re-measure swept clocks.
        """
        return all(self._kind_finished(kind) for kind in self.kinds) and not self._finished

    def _assign_sweep(self) -> List[int]:
        clock = {}
        for kind in self.kinds:
            clock[kind] = (
                self.clocks_mhz[0] if self._kind_finished(kind) else self._next_clock([kind])
            )
        return [clock[instruction] for instruction, _ in self.order]

    def _warmup_positions(self, freqs: Sequence[Optional[int]]) -> List[int]:
        return warmup_positions(self.order, freqs, self.warmup_instructions)

    def finish(self) -> None:
        """Assign no further clocks; pending steps still count when reported."""
        self._finished = True
        self._retry = []
        for kind in self.kinds:
            if not self._kind_finished(kind):
                self._cursor[kind] = len(self.clocks_mhz)

    # -- observation ----------------------------------------------------------------------------
    def mark_reported(self, step: int) -> None:
        """Every rank of the stage reported ``step``."""
        self._pending.discard(step)

    @property
    def pending_steps(self) -> List[int]:
        """Assigned steps not reported yet."""
        return sorted(self._pending)

    @property
    def observing(self) -> bool:
        """Some kind has not stopped yet (the stop rule still wants fresh estimates)."""
        return any(self.stopped_at[kind] is None for kind in self.kinds) and not self._finished

    def observe(self, energy_j: Dict[Tuple[str, int], float]) -> None:
        """Re-run the stop rule on the current energy estimates per (kind, frequency).

        Once a kind stopped it stays stopped (later estimates refine the profile only).
        """
        for kind in self.kinds:
            if self.stopped_at[kind] is not None:
                continue
            series = []
            for clock in self.clocks_mhz:
                if (kind, clock) not in energy_j:
                    break
                series.append((clock, energy_j[(kind, clock)]))
            self.stopped_at[kind] = self._stop[kind].evaluate(series)

    @property
    def done(self) -> bool:
        """No clock left to try and every assigned step reported."""
        return self.exhausted and not self._pending

    # -- persistence ----------------------------------------------------------------------------
    def to_state(self) -> Dict[str, Any]:
        """Everything that changes while sweeping, as JSON-ready data (see :meth:`from_state`)."""
        return {
            "clocks_mhz": list(self.clocks_mhz),
            "mode": self.mode,
            "warmup_instructions": self.warmup_instructions,
            "patience": self._stop[self.kinds[0]].patience,
            "max_steps": self.max_steps,
            "min_window_s": self.min_window_s,
            "steps_per_window": self.steps_per_window,
            "window_left": self._window_left,
            "window_freqs": list(self._window_freqs),
            "blocks": [list(b) for b in self._blocks],
            "stopped_at": dict(self.stopped_at),
            "cursor": dict(self._cursor),
            "finished": self._finished,
            "refine": list(self._refine),
            "refine_ascending": self._ascending,
            "refine_priority": self.refine_priority,
            "lag_clock": self._lag_clock,
            "assigned": {str(k): v for k, v in self.assigned.items()},
            "pending": sorted(self._pending),
            "retry": list(self._retry),
        }

    @classmethod
    def from_state(cls, order: Sequence[Tuple[str, int]], state: Dict[str, Any]) -> StageSweep:
        """The sweep :meth:`to_state` described (``order``: the stage's instruction order)."""
        sweep = cls(
            order,
            state["clocks_mhz"],
            mode=state["mode"],
            patience=int(state["patience"]),
            warmup_instructions=int(state["warmup_instructions"]),
            max_steps=state["max_steps"],
        )
        sweep.min_window_s = float(state["min_window_s"])
        sweep.steps_per_window = int(state.get("steps_per_window", 1))
        sweep._window_left = int(state.get("window_left", 0))
        sweep._window_freqs = [int(f) for f in state.get("window_freqs", [])]
        sweep._blocks = [(int(a), int(b)) for a, b in state["blocks"]]
        sweep.stopped_at = {
            k: (None if v is None else int(v)) for k, v in state["stopped_at"].items()
        }
        sweep._cursor = {k: int(v) for k, v in state["cursor"].items()}
        sweep._finished = bool(state["finished"])
        sweep._refine = [int(c) for c in state["refine"]]
        sweep._ascending = bool(state.get("refine_ascending", False))
        priority = state["refine_priority"]
        sweep.refine_priority = None if priority is None else [int(c) for c in priority]
        sweep._lag_clock = int(state["lag_clock"])
        sweep.assigned = {int(k): [int(f) for f in v] for k, v in state["assigned"].items()}
        sweep.warmup = {k: sweep._warmup_positions(v) for k, v in sweep.assigned.items()}
        sweep._pending = {int(s) for s in state["pending"]}
        sweep._retry = [[int(f) for f in v] for v in state["retry"]]
        return sweep

    @property
    def num_steps(self) -> int:
        """Steps this stage has been given a profiling schedule for."""
        return len(self.assigned)
