"""Progress that follows the work left: a job's stages, each weighed by its expected seconds.

A solve (and the whole ``perseus-plan`` command around it) runs a fixed sequence of stages --
the LP sweep, the refinement, the search, the gap filling, writing, plotting -- and a cost
model says how many seconds each is expected to take (:mod:`.solvers.lp.cost`). The fraction
done is the expected work done over the expected work of every stage still to run or run:

* a stage reports how far it is (``done`` in [0, 1]: deadlines solved out of those expected,
  windows polished out of those to polish, ...);
* starting a stage finishes the stages before it that started and *drops* those that never
  did (the search when the plan is already close to the bound): their work is gone, so the
  fraction jumps to where the work left says it is;
* a stage whose size turns out different (the LP sweep stopping early, more gaps to fill)
  is re-sized.

So the fraction is below 1 while any stage has work left, and 1 once the last one ends. With
the elapsed time it also gives the time left: ``elapsed * (1 - fraction) / fraction`` (the
cost model's seconds scaled by how fast this machine turns out to be).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from perseus.errors import SolverError

#: ``progress(message, fraction_done)``; fraction in [0, 1].
Progress = Callable[[str, float], None]
#: How far below 1 the fraction stays while a stage has not ended (a stage expected to take
#: no time, or one whose work was underestimated, is still work left).
UNFINISHED = 1e-4

__all__ = ["Progress", "StageWork", "WorkMeter", "announce", "time_left_s"]


@dataclass
class StageWork:
    """One stage of a job.

    Attributes:
        name: The stage's name (unique within the job).
        expected_s: Seconds the cost model expects it to take.
        done: Fraction of it done (0..1).
        started: It has reported at least once.
        dropped: It will not run (its work left the total).
    """

    name: str
    expected_s: float
    done: float = 0.0
    started: bool = False
    dropped: bool = False


class WorkMeter:
    """The fraction done of a sequence of stages (see the module docstring).

    Args:
        stages: ``(name, expected seconds)`` in the order they run.
        progress: Called with ``(message, fraction done)`` at every update (None: quiet).

    Raises:
        SolverError: no stage, a name twice, or a negative expectation.
    """

    def __init__(
        self, stages: Sequence[Tuple[str, float]], progress: Optional[Progress] = None
    ) -> None:
        self._stages: List[StageWork] = [StageWork(name, float(s)) for name, s in stages]
        self._index: Dict[str, int] = {s.name: k for k, s in enumerate(self._stages)}
        if not self._stages or len(self._index) != len(self._stages):
            raise SolverError(f"a work meter needs distinct stages, got {[n for n, _ in stages]}")
        if any(s.expected_s < 0 for s in self._stages):
            raise SolverError(f"negative expected seconds in {list(stages)}")
        self.progress = progress

    @property
    def stages(self) -> List[StageWork]:
        """The stages, in order."""
        return list(self._stages)

    def expected_s(self) -> float:
        """Expected seconds of every stage not dropped."""
        return sum(s.expected_s for s in self._stages if not s.dropped)

    def left_s(self) -> float:
        """Expected seconds of the work left."""
        return sum(s.expected_s * (1.0 - s.done) for s in self._stages if not s.dropped)

    def fraction(self) -> float:
        """Expected work done over expected work: below 1 while a stage has not ended."""
        unfinished = any(s.done < 1.0 for s in self._stages if not s.dropped)
        total = self.expected_s()
        done = 1.0 - self.left_s() / total if total > 0 else 0.0
        if unfinished:
            return min(done, 1.0 - UNFINISHED)
        return 1.0

    def stage(self, name: str) -> StageWork:
        """The stage called ``name``."""
        try:
            return self._stages[self._index[name]]
        except KeyError:
            raise SolverError(f"no stage {name!r} in {list(self._index)}") from None

    def update(self, name: str, done: float, message: str) -> None:
        """Stage ``name`` is ``done`` (0..1) far; report ``message`` with the fraction.

        Starting a stage finishes the earlier ones that started and drops those that never
        did. ``done`` never goes back (a stage reporting less keeps what it had).
        """
        self._advance(name, done)
        self.report(message)

    def finish(self, name: str, message: Optional[str] = None) -> None:
        """Stage ``name`` is done (as :meth:`update`; reported when ``message`` is given)."""
        self._advance(name, 1.0)
        if message is not None:
            self.report(message)

    def resize(self, name: str, expected_s: float) -> None:
        """Stage ``name`` turns out to need ``expected_s`` seconds in all."""
        self.stage(name).expected_s = max(0.0, float(expected_s))

    def reporter(self, name: str, part: int = 0, parts: int = 1) -> Progress:
        """A progress callback for a stage's own code: ``(message, done)`` updates ``name``.

        Args:
            name: The stage.
            part: Which of ``parts`` equal runs of the stage this one is (e.g. the search at
                the second of two deadlines): ``done`` then covers ``1 / parts`` of it.
            parts: Runs of the stage.
        """
        return lambda message, done: self.update(name, (part + done) / parts, message)

    def report(self, message: str) -> None:
        """Call the progress callback with ``message`` and the fraction done."""
        if self.progress is not None:
            self.progress(message, self.fraction())

    def _advance(self, name: str, done: float) -> None:
        stage = self.stage(name)
        for earlier in self._stages[: self._index[name]]:
            if earlier.started:
                earlier.done = 1.0
            else:
                earlier.dropped = True
        stage.started, stage.dropped = True, False
        stage.done = max(stage.done, min(1.0, max(0.0, float(done))))


def announce(progress: Optional[Progress], stages: Sequence[StageWork]) -> None:
    """Tell ``progress`` the stages ahead and their expected seconds, if it asks for them.

    A progress callback asks by having an ``expect(stages)`` method (``perseus-plan``'s logs
    the estimate with it); plain callables are left alone.
    """
    expect = getattr(progress, "expect", None)
    if callable(expect):
        expect([(s.name, s.expected_s) for s in stages])


def time_left_s(elapsed_s: float, fraction: float) -> Optional[float]:
    """Seconds left at this pace: ``elapsed * (1 - fraction) / fraction`` (None before 1 %)."""
    if fraction < 0.01:
        return None
    return max(0.0, elapsed_s * (1.0 - fraction) / fraction)
