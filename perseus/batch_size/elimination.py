"""Ruling batch sizes out with confidence, and stopping a run that explores one already ruled out.

A batch size is *ruled out* when the posterior probability that its runs cost less on average
than those of the best batch size (the one with the lowest expected cost) falls below
``threshold`` (:data:`RULE_OUT_PROBABILITY`). The probability comes from
:class:`~perseus.batch_size.posterior.CostPosterior`: a batch size's own runs, what its
neighbours' epochs say about it, how fast epochs change between batch sizes in this job, and its
measured epoch cost (predicted from its neighbours' before it ran: a batch size whose one epoch
would cost more than a run of the best is out before it is tried). Nothing is ruled out after a
fixed number of runs: a batch size stays in play until the evidence says it is worse, and comes
back if the best one's estimate gets worse.

A run in progress at a batch size that is ruled out (from its first epoch on, its epoch cost is
known) stops when finishing it is expected to cost more than a fresh run of the best batch size:
the expected rest of the run (its remaining epochs given it has not reached the target yet, up to
the epoch budget or the early-stop bound, and a fresh run on top when it would not converge)
against the best one's expected run cost. A run close to its end goes on; a run that has only
begun stops.

A pruning run may also be *deferred* (:func:`defer_verdict`): stopped so that the walk explores
the other side first, when the two orders' expected costs say so (the run of the other side it
pays now included). Whether the walk will then find this batch size ruled out is judged on the
posteriors it will see: one per likely outcome of the other side's run, with the deferred run
counted as stopped short (:func:`prob_ruled_out_after`). Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from perseus.batch_size.posterior import CostPosterior, normal_cdf
from perseus.batch_size.pruning import DEFERRED

RULED_OUT = "ruled_out"
# Below this posterior probability of being cheaper than the best, a batch size is ruled out.
RULE_OUT_PROBABILITY = 0.025
# Outcomes of the other side's run a deferral weighs (equal-probability points of its epochs).
OUTCOMES = 5


@dataclass(frozen=True)
class Standing:
    """One batch size against the best.

    Attributes:
        batch_size: The batch size.
        expected_cost: Posterior mean of a run's cost.
        prob_cheaper: Posterior probability that its runs cost less on average than the best
            batch size's (None for the best itself).
        ruled_out: ``prob_cheaper`` is below the threshold.
    """

    batch_size: int
    expected_cost: float
    prob_cheaper: Optional[float]
    ruled_out: bool


@dataclass(frozen=True)
class RunVerdict:
    """Whether a run in progress should stop early, and why.

    Attributes:
        batch_size: The run's batch size.
        action: ``ruled_out`` (the batch size is out) or ``deferred`` (the walk explores the
            other direction first and may come back).
        against: The batch size it was judged against: the best (ruled out), or the next one
            on the walk's other side (deferred).
        probability: P(cheaper than the best) (ruled out), or P(that next run rules this batch
            size out) (deferred).
        remaining_cost: Expected cost of finishing the run (a fresh run of the best included
            when it would not converge).
        other_cost: What stopping is expected to cost instead: a fresh run of the best (ruled
            out), or a full run of this batch size later times the chance that it is still in
            play then, plus the detour (deferred).
        stop: Whether to stop the run now.
        detour_cost: Deferred: the expected cost of the other side's run times the chance that
            finishing this run would have spared it (this batch size is cheaper than the best
            and than the other side's); None when it was not weighed (a ruled-out verdict, or
            finishing was the cheaper order without it).
    """

    batch_size: int
    action: str
    against: int
    probability: float
    remaining_cost: float
    other_cost: float
    stop: bool
    detour_cost: Optional[float] = None

    def describe(self) -> str:
        """One sentence for the user."""
        verb = "stopped" if self.stop else "went on"
        if self.action == DEFERRED:
            detour = (
                f"and {self.detour_cost:.4g} for running {self.against} first, a run finishing "
                "this one may spare"
                if self.detour_cost is not None
                else f"before the run of {self.against} it pays first"
            )
            return (
                f"batch size {self.batch_size} deferred: a run of {self.against} (the other "
                f"side's next) would rule it out with P = {self.probability:.1%}; finishing it "
                f"was expected to cost {self.remaining_cost:.4g}, deferring it "
                f"{self.other_cost:.4g} (a full run later x the chance it is still in play, "
                f"{detour}), so the run {verb}"
            )
        return (
            f"batch size {self.batch_size} ruled out: P(cheaper than {self.against}) = "
            f"{self.probability:.1%}; finishing it was expected to cost {self.remaining_cost:.4g}"
            f" against {self.other_cost:.4g} for a fresh run of {self.against}, so the run {verb}"
        )


def standings(
    posterior: CostPosterior,
    candidates: Sequence[int],
    threshold: float = RULE_OUT_PROBABILITY,
) -> Tuple[Optional[int], Dict[int, Standing]]:
    """The best of ``candidates`` (those with runs) and every candidate's standing against it.

    Candidates never run are predicted from the others (when anything can be said of them).

    Args:
        posterior: The job's posterior.
        candidates: The batch sizes to compare.
        threshold: Rule-out probability.
    """
    best = best_of(posterior, candidates)
    if best is None:
        return None, {}
    out: Dict[int, Standing] = {best: Standing(best, posterior.expected_cost(best), None, False)}
    for b in candidates:
        if b == best or not posterior.can_predict(b):
            continue
        p = posterior.prob_cheaper(b, best)
        out[b] = Standing(b, posterior.expected_cost(b), p, p < threshold)
    return best, out


def best_of(posterior: CostPosterior, candidates: Sequence[int]) -> Optional[int]:
    """The candidate with runs and the lowest expected cost (None when none has runs)."""
    known = [b for b in candidates if _has_runs(posterior, b)]
    if not known:
        return None
    return min(known, key=lambda b: (posterior.expected_log_cost(b), b))


def run_verdict(
    posterior: CostPosterior,
    batch_size: int,
    unit: float,
    epochs_done: int,
    max_epochs: int,
    best: int,
    threshold: float = RULE_OUT_PROBABILITY,
) -> Optional[RunVerdict]:
    """Judge a run of ``batch_size`` that has run ``epochs_done`` epochs without converging.

    Returns None when the batch size is not ruled out (the run goes on to learn it).

    Args:
        posterior: The job's posterior from the finished runs.
        batch_size: The run's batch size.
        unit: Its epoch cost, measured in this run.
        epochs_done: Epochs it ran so far.
        max_epochs: Epochs it may run at most (epoch budget or early-stop bound).
        best: The best batch size.
        threshold: Rule-out probability.
    """
    if batch_size == best or not posterior.arms[batch_size].on_chain:
        return None
    p = posterior.prob_cheaper_running(batch_size, best, unit, epochs_done)
    if p >= threshold:
        return None
    fresh = posterior.expected_cost(best)
    epochs = _remaining_epochs(posterior, batch_size, epochs_done, max_epochs, fresh / unit)
    remaining = unit * epochs
    return RunVerdict(
        batch_size=batch_size,
        action=RULED_OUT,
        against=best,
        probability=p,
        remaining_cost=remaining,
        other_cost=fresh,
        stop=remaining > fresh,
    )


def defer_verdict(
    posterior: CostPosterior,
    batch_size: int,
    unit: float,
    epochs_done: int,
    max_epochs: int,
    best: int,
    other: int,
    threshold: float = RULE_OUT_PROBABILITY,
    *,
    other_max_epochs: Optional[int] = None,
    bound: Optional[float] = None,
    after_other: Optional[Callable[[int, float], CostPosterior]] = None,
) -> Optional[RunVerdict]:
    """Judge a pruning run that the walk could leave for ``other``, its other side's next step.

    The two orders of the walk are compared by what they are expected to cost:

    * **Defer**: a run of ``other`` now, and a full run of this batch size later, but only if it
      is still in play by then. With ``after_other`` (the posterior once this run is deferred
      and a run of ``other`` took the given epochs), that chance is what the walk will find:
      over equal-probability outcomes of ``other``'s run (:data:`OUTCOMES`), the share after
      which this batch size is ruled out (an outcome past ``other``'s epoch budget or the
      early-stop bound fails and rules nothing out). Without it, it is out then if the run of
      ``other`` costs less than the ``threshold`` quantile of this batch size's run cost given
      its runs so far (after such a run it would be cheaper with a probability below
      ``threshold``, if ``other`` were then known exactly).
    * **Finish**: the rest of this run now. When this batch size turns out dearer than the
      best, the walk turns to ``other`` next all the same, and when ``other`` is the cheaper of
      the two its run is worth having whenever it comes. But when this batch size turns out
      cheaper than both, the walk goes on along this side, and what it learns there (the trend
      of the epochs, a tighter early-stop bound) leaves ``other``'s run to the end of the walk,
      to be stopped early or ruled out before it runs. Deferring pays that run now: its
      *detour*, the expected cost of a run of ``other`` times the probability that this batch
      size is cheaper than the best and than ``other`` (the two taken as independent).

    The run stops when deferring is expected to cost less than finishing (the detour is weighed
    only when the rest already favours deferring). The posterior predicts both runs; each is
    capped as a run is (its epoch budget, the early-stop ``bound``; one that would not converge
    pays a fresh run of the best on top). Returns None when nothing can be said.

    Args:
        posterior: The job's posterior from the finished runs.
        batch_size: The run's batch size.
        unit: Its epoch cost, measured in this run.
        epochs_done: Epochs it ran so far.
        max_epochs: Epochs this run may run at most (epoch budget or early-stop bound).
        best: The best batch size.
        other: The other side's next batch size.
        threshold: Rule-out probability.
        other_max_epochs: The epoch budget of a run of ``other`` (default ``max_epochs``).
        bound: The early-stop bound on a run's cost (None: none yet).
        after_other: ``(epochs, epoch cost) -> posterior`` once this run is deferred and a run
            of ``other`` reached the target in that many epochs, each of that cost (``other``'s
            as predicted now).
    """
    if batch_size == best or not posterior.arms[batch_size].on_chain:
        return None
    if not posterior.can_predict(other) or not posterior.arms[other].on_chain:
        return None
    budget = max_epochs if other_max_epochs is None else other_max_epochs
    if after_other is not None:
        ruled_out_later = prob_ruled_out_after(
            posterior, batch_size, other, after_other, threshold, budget=budget, bound=bound
        )
    else:
        quantile = posterior.cost_quantile_running(batch_size, threshold, unit, epochs_done)
        ruled_out_later = posterior.prob_cost_below(other, quantile)
    fresh = posterior.expected_cost(best)
    epochs = _remaining_epochs(posterior, batch_size, epochs_done, max_epochs, fresh / unit)
    remaining = unit * epochs
    full = unit * _remaining_epochs(posterior, batch_size, 0, max_epochs, fresh / unit)
    comeback = (1.0 - ruled_out_later) * full
    detour: Optional[float] = None  # not weighed when finishing is cheaper without it
    if comeback < remaining:
        detour = 0.0
        spared = posterior.prob_cheaper_running(batch_size, best, unit, epochs_done)
        if spared > 0.0:
            spared *= posterior.prob_cheaper_running(batch_size, other, unit, epochs_done)
        if spared > 0.0:
            detour = spared * _expected_run_cost(posterior, other, budget, bound, fresh)
    other_cost = comeback + (detour or 0.0)
    return RunVerdict(
        batch_size=batch_size,
        action=DEFERRED,
        against=other,
        probability=ruled_out_later,
        remaining_cost=remaining,
        other_cost=other_cost,
        stop=other_cost < remaining,
        detour_cost=detour,
    )


def prob_ruled_out_after(
    posterior: CostPosterior,
    batch_size: int,
    other: int,
    after_other: Callable[[int, float], CostPosterior],
    threshold: float = RULE_OUT_PROBABILITY,
    *,
    budget: int,
    bound: Optional[float] = None,
) -> float:
    """P(``batch_size`` is ruled out once a run of ``other``, never run yet, reached the target).

    ``other``'s epochs are taken at :data:`OUTCOMES` equal-probability points of their
    predictive distribution, each epoch at its predicted cost; each outcome's posterior
    (``after_other(epochs, epoch cost)``) judges
    ``batch_size`` against its best, as the walk will. An outcome past ``budget`` epochs, or
    whose cost passes the early-stop ``bound``, fails instead and rules nothing out. The
    outcomes are judged from the fewest epochs up, and the first that leaves ``batch_size`` in
    play ends the count: a run of ``other`` taking more epochs says less against it.
    """
    unit = posterior.expected_unit(other)
    if not math.isfinite(unit) or unit <= 0.0:
        return 0.0
    out = 0.0
    for epochs in sorted(_epoch_outcomes(posterior, other)):
        if epochs > budget or (bound is not None and epochs * unit > bound):
            break
        after = after_other(epochs, unit)
        best = best_of(after, list(after.arms))
        if best is None or best == batch_size:
            break
        if after.prob_cheaper(batch_size, best) >= threshold:
            break
        out += 1.0 / OUTCOMES
    return out


def _epoch_outcomes(posterior: CostPosterior, batch_size: int) -> List[int]:
    """Epochs of a run at the :data:`OUTCOMES` equal-probability points of their predictive."""
    parts = posterior.predictive_epochs(batch_size)
    lowest = min(g.mean - 10.0 * math.sqrt(g.var) for g in parts)
    highest = max(g.mean + 10.0 * math.sqrt(g.var) for g in parts)
    out = []
    for k in range(OUTCOMES):
        prob = (k + 0.5) / OUTCOMES
        low, high = lowest, highest
        for _ in range(50):
            mid = 0.5 * (low + high)
            below = sum(g.weight * normal_cdf((mid - g.mean) / math.sqrt(g.var)) for g in parts)
            low, high = (mid, high) if below < prob else (low, mid)
        out.append(max(1, math.floor(math.exp(0.5 * (low + high)) + 0.5)))
    return out


def _expected_run_cost(
    posterior: CostPosterior, batch_size: int, max_epochs: int, bound: Optional[float], fresh: float
) -> float:
    """Expected cost of a run of ``batch_size`` never run before, capped as a run is.

    Its epoch cost is the posterior's mean; the run stops at its epoch budget, or before the
    epoch that passes ``bound``, and then pays a fresh run of the best (``fresh``) on top.
    """
    unit = posterior.expected_unit(batch_size)
    if not math.isfinite(unit) or unit <= 0.0:
        return math.inf
    budget = run_budget(max_epochs, bound, unit)
    return unit * _remaining_epochs(posterior, batch_size, 0, max(budget, 1), fresh / unit)


def run_budget(max_epochs: int, bound: Optional[float], unit: float) -> int:
    """Epochs a run may take at most: its epoch budget, or fewer under the early-stop ``bound``."""
    if bound is None:
        return max_epochs
    return min(max_epochs, int(bound * (1.0 + 1e-9) // unit))


def _has_runs(posterior: CostPosterior, batch_size: int) -> bool:
    arm = posterior.arms[batch_size]
    return bool(arm.log_units) and (batch_size in posterior.units or not arm.on_chain)


def _remaining_epochs(
    posterior: CostPosterior,
    batch_size: int,
    epochs_done: int,
    max_epochs: int,
    fresh_epochs: float,
) -> float:
    """Expected epochs still to pay for, given the target not reached after ``epochs_done``.

    A run that would need more than ``max_epochs`` pays them all and then a fresh run
    (``fresh_epochs``, in this batch size's epochs).
    """
    if epochs_done >= max_epochs:
        return fresh_epochs
    total = 0.0
    mass = 0.0
    for g in posterior.predictive_epochs(batch_size):
        sd = math.sqrt(g.var)
        below = normal_cdf((math.log(epochs_done + 0.5) - g.mean) / sd)
        alive = 1.0 - below
        if alive <= 0.0:
            continue
        cumulative = below
        part = 0.0
        for epoch in range(epochs_done + 1, max_epochs + 1):
            upper = normal_cdf((math.log(epoch + 0.5) - g.mean) / sd)
            part += (upper - cumulative) * (epoch - epochs_done)
            cumulative = upper
        tail = 1.0 - cumulative
        part += tail * (max_epochs - epochs_done + fresh_epochs)
        total += g.weight * part
        mass += g.weight * alive
    if mass <= 0.0:
        return float(max_epochs - epochs_done) + fresh_epochs
    return total / mass
