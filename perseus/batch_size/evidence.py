"""The job's runs as the posterior takes them, and as they would be after a run not yet made.

:func:`fit_posterior` turns the stored runs into a
:class:`~perseus.batch_size.posterior.CostPosterior`: each batch size's counted runs (converged
ones, and bandit runs that failed, at their cost plus a fresh run of the cheapest), the epoch
cost of every batch size that ran an epoch (a run in progress included), and the pruning runs
that stopped before the target (:func:`censored_runs`: deferred, stopped early, out of epochs),
each a censored observation of its batch size. :func:`posterior_after` is the same posterior
once a pruning run in progress is deferred and a run of another batch size reached the target
in a given number of epochs: what a deferral is judged on. Standard library only.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Dict, List, Optional, Sequence

from perseus.batch_size import bandit
from perseus.batch_size.posterior import CostPosterior
from perseus.batch_size.pruning import DEFERRED, PRUNING
from perseus.batch_size.store import FAILED, REACHED, RUNNING, RunRow

# Whether a run's last metric meets the job's target.
ReachesTarget = Callable[[Optional[float]], bool]


def fit_posterior(
    runs: Sequence[RunRow], batch_sizes: Sequence[int], reaches_target: ReachesTarget
) -> CostPosterior:
    """The posterior of the job's finished runs, with the epoch costs of running ones too."""
    finished = [r for r in runs if r.status != RUNNING and r.cost is not None]
    running = [r for r in runs if r.status == RUNNING and r.epoch_cost is not None]
    arms = bandit.arms_from_runs(finished, batch_sizes, with_failures=True)
    units = {a.batch_size: a.epoch_cost for a in arms if a.epoch_cost}
    for b in {r.batch_size for r in running}:
        measured = [r.epoch_cost for r in runs if r.batch_size == b and r.epoch_cost]
        units[b] = statistics.fmean(measured)
    censored = censored_runs(finished, reaches_target)
    return CostPosterior([a.runs() for a in arms], units, censored)


def censored_runs(
    finished: Sequence[RunRow], reaches_target: ReachesTarget
) -> Dict[int, List[int]]:
    """Epochs of each pruning run that stopped before the target, by batch size.

    Such a run (stopped early, deferred, or out of epochs) says its batch size needs more
    epochs than it ran; bandit runs that failed are counted by their cost instead.
    """
    out: Dict[int, List[int]] = {}
    for r in finished:
        if (
            r.phase == PRUNING
            and r.status == FAILED
            and r.num_epochs >= 1
            and not reaches_target(r.last_metric)
        ):
            out.setdefault(r.batch_size, []).append(r.num_epochs)
    return out


def posterior_after(
    runs: Sequence[RunRow],
    run: RunRow,
    other: int,
    epochs: int,
    *,
    batch_sizes: Sequence[int],
    reaches_target: ReachesTarget,
    target_metric: float,
    unit: float,
) -> CostPosterior:
    """:func:`fit_posterior` if ``run`` (in progress) were deferred now and ``other`` then ran.

    The run of ``other`` reached the target in ``epochs`` epochs of cost ``unit`` each.
    """
    # A run deferred before its first epoch ended keeps its price (its cost is then 0).
    deferred = dataclasses.replace(run, status=FAILED, reason=DEFERRED, cost=run.cost or 0.0)
    reached = dataclasses.replace(
        run,
        run_id=-1,
        batch_size=other,
        status=REACHED,
        reason=None,
        num_epochs=epochs,
        cost=unit * epochs,
        last_metric=target_metric,
    )
    after = [deferred if r.run_id == run.run_id else r for r in runs] + [reached]
    return fit_posterior(after, batch_sizes, reaches_target)
