"""Which frequency every instruction of one stage runs at while that stage is profiled.

Two modes (``profiler.mode``):

* ``sweep`` — one window per instruction kind per iteration: every forward of the iteration runs
  at the forward's current frequency, every backward at the backward's; each kind walks down the
  clock list on its own and stops on its own.
* ``fast`` — forward and backward sweep together and one iteration carries several frequencies:
  the stage's instruction order is cut into contiguous blocks (each holding enough forwards and
  backwards, and lasting at least ``min_window_s``), and consecutive blocks take consecutive
  clocks, high to low.

The first ``warmup_instructions`` instructions after a clock change are left out of the time
averages: in ``fast`` mode the first ones of each block, in ``sweep`` mode the first ones of each
kind in the iteration (forwards and backwards alternate there, so "after a change" would be every
instruction).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from perseus.profiler.stop import EnergyRiseStop

KINDS = ("forward", "backward")


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
    ) -> None:
        if mode not in ("fast", "sweep"):
            raise ValueError(f"profiler.mode={mode!r}: choose 'fast' or 'sweep'")
        if not clocks_mhz:
            raise ValueError("no clocks to sweep")
        self.order = [(str(i), int(m)) for i, m in order]
        self.clocks_mhz = list(clocks_mhz)
        self.mode = mode
        self.warmup_instructions = max(0, int(warmup_instructions))
        self._stop = {kind: EnergyRiseStop(patience) for kind in KINDS}
        self.stopped_at: Dict[str, Optional[int]] = {kind: None for kind in KINDS}
        self._cursor = {kind: 0 for kind in KINDS}  # next clock index per kind (fast: shared)
        self._blocks = _blocks(
            self.order,
            self.warmup_instructions,
            min_per_kind,
            min_window_s,
            instruction_time_s or {},
        )
        self.assigned: Dict[int, List[int]] = {}
        self.warmup: Dict[int, List[int]] = {}
        self._pending: set = set()

    # -- assignment -----------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """No clock is left to assign (every kind stopped or reached the lowest clock)."""
        return all(self._kind_finished(kind) for kind in KINDS)

    def _kind_finished(self, kind: str) -> bool:
        return self.stopped_at[kind] is not None or self._cursor[kind] >= len(self.clocks_mhz)

    def frequencies_for_step(self, step: int) -> List[int]:
        """Frequencies of every position of ``step`` (computed once, then repeated)."""
        if step not in self.assigned:
            freqs = self._assign_fast() if self.mode == "fast" else self._assign_sweep()
            self.assigned[step] = freqs
            self.warmup[step] = self._warmup_positions(freqs)
            self._pending.add(step)
        return self.assigned[step]

    def _next_clock(self, kinds: Sequence[str]) -> int:
        index = max(self._cursor[k] for k in kinds)
        if index >= len(self.clocks_mhz):
            return self.clocks_mhz[0]
        for k in kinds:
            self._cursor[k] = index + 1
        return self.clocks_mhz[index]

    def _assign_fast(self) -> List[int]:
        freqs: List[int] = []
        for begin, end in self._blocks:
            live = [k for k in KINDS if not self._kind_finished(k)]
            clock = self._next_clock(live) if live else self.clocks_mhz[0]
            freqs.extend([clock] * (end - begin))
        return freqs

    def _assign_sweep(self) -> List[int]:
        clock = {}
        for kind in KINDS:
            clock[kind] = (
                self.clocks_mhz[0] if self._kind_finished(kind) else self._next_clock([kind])
            )
        return [clock[instruction] for instruction, _ in self.order]

    def _warmup_positions(self, freqs: List[int]) -> List[int]:
        out: List[int] = []
        if self.mode == "fast":
            for begin, end in self._blocks:
                out.extend(range(begin, min(end, begin + self.warmup_instructions)))
            return out
        seen = {kind: 0 for kind in KINDS}
        for pos, (instruction, _) in enumerate(self.order):
            if seen.get(instruction, 0) < self.warmup_instructions:
                out.append(pos)
            seen[instruction] = seen.get(instruction, 0) + 1
        return out

    def finish(self) -> None:
        """Assign no further clocks; pending steps still count when reported."""
        for kind in KINDS:
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

    def observe(self, energy_j: Dict[Tuple[str, int], float]) -> None:
        """Re-run the stop rule on the current energy estimates per (kind, frequency).

        Once a kind stopped it stays stopped (later estimates refine the profile only).
        """
        for kind in KINDS:
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

    @property
    def num_steps(self) -> int:
        """Steps this stage has been given a profiling schedule for."""
        return len(self.assigned)


def _blocks(
    order: List[Tuple[str, int]],
    warmup: int,
    min_per_kind: int,
    min_window_s: float,
    time_s: Dict[str, float],
) -> List[Tuple[int, int]]:
    """Contiguous ``[begin, end)`` position ranges for ``fast`` mode."""
    blocks: List[Tuple[int, int]] = []
    begin = 0
    counts = {kind: 0 for kind in KINDS}
    duration_s = 0.0
    for pos, (instruction, _) in enumerate(order):
        if pos - begin >= warmup:
            counts[instruction] = counts.get(instruction, 0) + 1
        duration_s += time_s.get(instruction, 0.0)
        if all(counts[k] >= min_per_kind for k in KINDS) and duration_s >= min_window_s:
            blocks.append((begin, pos + 1))
            begin = pos + 1
            counts = {kind: 0 for kind in KINDS}
            duration_s = 0.0
    if begin < len(order):
        if blocks:
            blocks[-1] = (blocks[-1][0], len(order))
        else:
            blocks.append((0, len(order)))
    return blocks
