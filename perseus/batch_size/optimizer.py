"""Batch-size optimizer for recurring jobs: prune, then a multi-armed bandit across runs.

A recurring job (the same training, re-run on new data or code) is run many times. Each run asks
for a batch size, trains to a target metric and reports what it cost:
``cost = eta * E + (1 - eta) * P_max * T`` (joules; ``P_max`` the maximum power of all the
job's GPUs), with ``E`` and ``T`` taken at the batch size's chosen power limit (epochs spent
profiling power limits are reported with what they would have cost at the chosen one). The
optimizer first prunes batch sizes that cannot reach the target at an acceptable cost
(:mod:`perseus.batch_size.pruning`), then picks among the rest with Thompson sampling
(:mod:`perseus.batch_size.bandit`).

A run is stopped early when the next epoch would take its cost past ``beta`` times the
cheapest converged run so far, or when it misses the target within ``max_epochs``; a run that
reaches the target but costs more than that bound does not count as converged.

A run's epochs, its early stop and its end are reported through
:class:`~perseus.batch_size.reporting.RunReporting`, the optimizer's base class.

Everything lives in a SQLite file (:mod:`perseus.batch_size.store`), so runs in different
processes or machines sharing the file continue one search::

    bso = BatchSizeOptimizer("bso.db", "nightly-resnet", [64, 128, 256, 512], 256)
    batch_size = bso.next_batch_size()
    for epoch in range(bso.max_epochs):
        metric, time_s, energy_j = train_one_epoch(batch_size)
        bso.report_epoch(metric, time_s, energy_j)
        if bso.should_stop():
            break
    bso.report_run()

When every batch size of a pruning round fails, :meth:`BatchSizeOptimizer.next_batch_size`
raises a :class:`~perseus.errors.BatchSizeError` that says which failed and why; the job stays
readable (:meth:`~BatchSizeOptimizer.summary`) and goes on after
:meth:`~BatchSizeOptimizer.retry_failed` (try those batch sizes again, e.g. with a larger
``max_epochs``) or :meth:`~BatchSizeOptimizer.reset` (start the search over).

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from perseus.batch_size import bandit
from perseus.batch_size.bandit import BANDIT
from perseus.batch_size.elimination import (
    RULE_OUT_PROBABILITY,
    RULED_OUT,
    RunVerdict,
    Standing,
    best_of,
    defer_verdict,
    run_budget,
    run_verdict,
    standings,
)
from perseus.batch_size.evidence import fit_posterior, posterior_after
from perseus.batch_size.explain import check_settings, exhausted_message, explain_lines
from perseus.batch_size.posterior import CostPosterior
from perseus.batch_size.pruning import (
    PRUNING,
    PruningState,
    defer_target,
    pruning_state,
    start_batch_size,
)
from perseus.batch_size.reporting import RunReporting
from perseus.batch_size.store import REACHED, RUNNING, RunRow, Store, batch_sizes_key
from perseus.errors import BatchSizeError

log = logging.getLogger(__name__)

EXHAUSTED = "exhausted"


class BatchSizeOptimizer(RunReporting):
    """Choose the batch size of each run of a recurring job.

    Each run reports its epochs and its end through the methods of :class:`RunReporting`.

    Args:
        db_path: SQLite file shared by all runs of the job (created when missing).
        job_id: Name of the recurring job inside the file.
        batch_sizes: Candidate batch sizes.
        default_batch_size: Where pruning starts (the batch size the job used so far).
        eta: Weight of energy in the cost, within [0, 1].
        beta: Early-stop a run whose cost would pass ``beta`` x the cheapest converged run
            (> 1).
        max_epochs: Epoch budget of one run; missing the target within it fails the run.
        target_metric: The metric value that counts as converged.
        higher_is_better: Whether metrics at or above the target converge (accuracy), else at
            or below (loss).
        max_power_w: ``P_max`` of the cost: maximum power of all the job's GPUs together (W).
        num_pruning_rounds: Rounds of the pruning stage (0 skips it: every batch size is an
            arm). Round 1 starts at the default batch size, each later round at the cheapest
            batch size of the round before.
        num_exploration: Runs every arm gets before Thompson sampling starts (>= 1).
        seed: Seeds the bandit's samples (decisions are reproducible from the database).
        stale_run_s: A run still unreported this long after it started is counted as failed
            (its process died); None keeps such runs pending forever.
        rule_out_probability: A batch size whose posterior probability of being cheaper than
            the best falls below this is ruled out: the pruning walk does not run it, the bandit
            no longer samples it, and a run of it stops when finishing would cost more than a
            fresh run of the best. 0 turns every posterior-driven stop off (no rule-out, no
            deferral): runs stop only at the target, ``max_epochs`` or ``beta``.
    """

    def __init__(
        self,
        db_path: Union[str, Path],
        job_id: str,
        batch_sizes: Sequence[int],
        default_batch_size: int,
        *,
        eta: float = 0.5,
        beta: float = 2.0,
        max_epochs: int = 100,
        target_metric: float = 1.0,
        higher_is_better: bool = True,
        max_power_w: float = 300.0,
        num_pruning_rounds: int = 1,
        num_exploration: int = 1,
        seed: int = 0,
        stale_run_s: Optional[float] = 7 * 24 * 3600.0,
        rule_out_probability: float = RULE_OUT_PROBABILITY,
    ) -> None:
        self.batch_sizes = batch_sizes_key(batch_sizes)
        check_settings(
            self.batch_sizes,
            default_batch_size,
            eta,
            beta,
            max_epochs,
            max_power_w,
            num_pruning_rounds,
            num_exploration,
            rule_out_probability,
        )
        self.job_id = job_id
        self.default_batch_size = int(default_batch_size)
        self.eta = eta
        self.beta = beta
        self.max_epochs = max_epochs
        self.target_metric = target_metric
        self.higher_is_better = higher_is_better
        self.max_power_w = max_power_w
        self.num_pruning_rounds = num_pruning_rounds
        self.num_exploration = num_exploration
        self.seed = seed
        self.stale_run_s = stale_run_s
        self.rule_out_probability = rule_out_probability
        self.store = Store(Path(db_path))
        self.store.ensure_job(job_id, self._settings())
        self.run_id: Optional[int] = None
        # The posterior of the finished runs it was fitted on (refitted when they change).
        self._fitted: Optional[Tuple[Tuple[Any, ...], CostPosterior]] = None
        self._standing: Optional[
            Tuple[CostPosterior, Tuple[Optional[int], Dict[int, Standing]]]
        ] = None
        # The last run judged, with the job's runs it was judged on, and the verdict: a stop is
        # judged by should_stop() and again by report_run() (its reason, then its detail).
        self._verdict: Optional[Tuple[Tuple[Any, ...], Optional[RunVerdict]]] = None

    @classmethod
    def from_db(cls, db_path: Union[str, Path], job_id: str, **kwargs: Any) -> BatchSizeOptimizer:
        """Open a job registered earlier, with the settings stored in the database."""
        store = Store(Path(db_path))
        try:
            settings = store.job_settings(job_id)
        finally:
            store.close()
        settings.update(kwargs)
        return cls(db_path, job_id, **settings)

    # -- choosing --------------------------------------------------------------------------------
    def next_batch_size(self) -> int:
        """Start a run of the job and return the batch size it should train with.

        Raises:
            BatchSizeError: When every batch size of a pruning round failed; the message says
                which failed and why, and how to go on (:meth:`retry_failed`, :meth:`reset`).
        """
        exhausted: Optional[PruningState] = None
        with self.store.transaction() as conn:
            if self.stale_run_s is not None:
                expired = self.store.expire_runs(conn, self.job_id, time.time() - self.stale_run_s)
                if expired:
                    log.warning(
                        "job %s: %d unreported run(s) counted as failed", self.job_id, expired
                    )
            runs = self.store.runs(conn, self.job_id)
            state = self._pruning(runs)
            while state.skip:  # the walk's next step is ruled out: record it, go on
                self._record_skip(conn, state, runs)
                runs = self.store.runs(conn, self.job_id)
                state = self._pruning(runs)
            if state.exhausted:
                exhausted = state
            else:
                batch_size, phase, pruning_round, why = self._decide(runs, state, conn)
                self.run_id = self.store.add_run(
                    conn, self.job_id, batch_size, phase, pruning_round, why
                )
        if exhausted is not None:
            raise BatchSizeError(exhausted_message(exhausted, self))
        log.info("run %d of job %s: batch size %d (%s)", self.run_id, self.job_id, batch_size, why)
        return batch_size

    def resume_run(self, run_id: int) -> int:
        """Attach to a run started elsewhere (e.g. by the Hydra sweeper); returns its batch size."""
        self.run_id = run_id
        return self.store.run(run_id).batch_size

    def best_batch_size(self) -> Optional[int]:
        """The batch size with the lowest mean cost so far among those still in the running."""
        runs = self.store.runs(None, self.job_id)
        return bandit.best_arm(self._arms(runs, self._pruning(runs), converged_only=True))

    # -- the job's state -------------------------------------------------------------------------
    def summary(self) -> Dict[str, Any]:
        """The job's state: stage, arms, per batch size mean cost and runs, best so far.

        ``stage`` is ``pruning``, ``bandit`` or ``exhausted`` (then ``message`` says why and
        what to do, and ``failed`` lists each failed batch size's reason).
        """
        runs = self.store.runs(None, self.job_id)
        state = self._pruning(runs)
        arms = self._arms(runs, state, converged_only=True)
        stage = EXHAUSTED if state.exhausted else BANDIT if state.done else PRUNING
        out: Dict[str, Any] = {
            "job_id": self.job_id,
            "stage": stage,
            "arms": state.candidates if state.done else [a.batch_size for a in arms],
            "num_runs": sum(not _never_ran(r) for r in runs),
            "mean_cost": {a.batch_size: statistics.fmean(a.costs) for a in arms if a.costs},
            "best_batch_size": bandit.best_arm(arms),
        }
        if state.exhausted:
            out["message"] = exhausted_message(state, self)
            out["failed"] = {b: reason for b, (_, reason) in state.failed.items()}
        return out

    def standings(self) -> Dict[int, Standing]:
        """Every batch size still in the search, judged against the best one so far.

        Each :class:`~perseus.batch_size.elimination.Standing` holds its expected run cost, the
        posterior probability that it is cheaper than the best, and whether it is ruled out
        (batch sizes never run are predicted from the others, while the pruning walk may still
        reach them). Batch sizes the walk dropped (a failed run, or beyond one) are left out:
        their failures are not in these figures.
        """
        runs = self.store.runs(None, self.job_id)
        state = self._pruning(runs)
        playing = set(state.candidates)
        if not state.done:  # the walk may still reach the batch sizes never run
            playing |= {b for b in self.batch_sizes if not any(r.batch_size == b for r in runs)}
        return {b: st for b, st in self._standings(runs)[1].items() if b in playing}

    def explain(self) -> List[str]:
        """Why each run got its batch size and how it ended, then where every batch size stands.

        One line per run (oldest first), then one per batch size with a measured epoch cost;
        runs recorded before the reasons were kept say so.
        """
        runs = self.store.runs(None, self.job_id)
        return explain_lines(
            self.job_id,
            runs,
            self.store.explanations(self.job_id),
            self.standings(),
            self.summary(),
        )

    def reset(self) -> None:
        """Start the search over; runs so far stay in the file but no longer count."""
        generation = self.store.new_generation(self.job_id)
        self.run_id = None
        log.warning("job %s: search reset (generation %d)", self.job_id, generation)

    def retry_failed(self) -> int:
        """After every batch size of a pruning round failed: try that round again.

        The failed runs stop counting (they stay in the file), so the round walks from its
        start again — e.g. after raising ``max_epochs`` or fixing the training. Returns how many
        runs were set aside (0 when the job is not exhausted).
        """
        state = self._pruning(self.store.runs(None, self.job_id))
        if not state.exhausted:
            return 0
        run_ids = [run_id for run_id, _ in state.failed.values()]
        self.store.supersede(run_ids)
        log.warning(
            "job %s: retrying batch sizes %s of pruning round %d",
            self.job_id,
            sorted(state.failed),
            state.pruning_round + 1,
        )
        return len(run_ids)

    def close(self) -> None:
        """Close the database."""
        self.store.close()

    def run_options(self) -> Dict[str, Any]:
        """Settings that may differ between runs (not stored with the job)."""
        return {
            "beta": self.beta,
            "max_epochs": self.max_epochs,
            "num_exploration": self.num_exploration,
            "seed": self.seed,
            "stale_run_s": self.stale_run_s,
            "rule_out_probability": self.rule_out_probability,
        }

    # -- internals -------------------------------------------------------------------------------
    def _settings(self) -> Dict[str, Any]:
        # What defines the job's search; beta, max_epochs, seed may change between runs.
        return {
            "batch_sizes": self.batch_sizes,
            "default_batch_size": self.default_batch_size,
            "eta": self.eta,
            "max_power_w": self.max_power_w,
            "num_pruning_rounds": self.num_pruning_rounds,
            "target_metric": self.target_metric,
            "higher_is_better": self.higher_is_better,
        }

    def _pruning(self, runs: List[RunRow]) -> PruningState:
        return pruning_state(
            self.batch_sizes,
            self.default_batch_size,
            self.num_pruning_rounds,
            runs,
            self._ruled_out_predicate(runs),
        )

    def _ruled_out_predicate(self, runs: List[RunRow]) -> Callable[[int], bool]:
        """Whether a batch size is ruled out by the finished runs (before it runs again)."""
        if self.rule_out_probability <= 0:
            return lambda batch_size: False
        standing = self._standings(runs)[1]
        return lambda batch_size: batch_size in standing and standing[batch_size].ruled_out

    def _standings(self, runs: List[RunRow]) -> Tuple[Optional[int], Dict[int, Standing]]:
        """Every batch size against the best (computed once per fitted posterior)."""
        posterior = self._posterior(runs)
        if self._standing is None or self._standing[0] is not posterior:
            self._standing = (
                posterior,
                standings(posterior, self.batch_sizes, self.rule_out_probability),
            )
        return self._standing[1]

    def _record_skip(self, conn: Any, state: PruningState, runs: List[RunRow]) -> None:
        """Record the walk's next step as failed without running it: it is ruled out."""
        assert state.next_batch_size is not None
        best, standing = self._standings(runs)
        st = standing[state.next_batch_size]
        why = (
            f"ruled out before it ran: P(cheaper than {best}) = {st.prob_cheaper:.1%}, "
            f"predicted run cost {st.expected_cost:.4g}"
        )
        run_id = self.store.add_skipped(
            conn,
            self.job_id,
            state.next_batch_size,
            PRUNING,
            state.pruning_round,
            reason=RULED_OUT,
            why_chosen=_why_pruning(state, self.default_batch_size, runs),
            why_stopped=why,
        )
        log.info("job %s: step %d, batch size %d %s", self.job_id, run_id, st.batch_size, why)

    def _decide(
        self, runs: List[RunRow], state: PruningState, conn: Any
    ) -> Tuple[int, str, Optional[int], str]:
        """``(batch size, phase, pruning round, why)`` of the next run."""
        if state.next_batch_size is not None:
            return (
                state.next_batch_size,
                PRUNING,
                state.pruning_round,
                _why_pruning(state, self.default_batch_size, runs),
            )
        if not state.done:
            # Every step of the round is handed out and some still run elsewhere: run the
            # cheapest batch size so far (or the start) meanwhile.
            best = bandit.best_arm(self._arms(runs, state, converged_only=True))
            fallback = start_batch_size(state.candidates, self.default_batch_size)
            why = "pruning round busy in other runs: the cheapest batch size so far meanwhile"
            return (best if best is not None else fallback), BANDIT, None, why
        arms = self._arms(runs, state, converged_only=False)
        posterior = self._posterior(runs)
        _, standing = standings(posterior, [a.batch_size for a in arms], self.rule_out_probability)
        out = [b for b in sorted(standing) if standing[b].ruled_out]
        playing = [a for a in arms if a.batch_size not in out]
        ruled = ", ".join(f"{b} (P {standing[b].prob_cheaper:.1%})" for b in out)
        why_out = f"; ruled out: {ruled}" if out else ""
        unexplored = [a.batch_size for a in playing if len(a.costs) < self.num_exploration]
        if unexplored:
            choice = start_batch_size(unexplored, self.default_batch_size)
            why = f"bandit: {choice} has fewer than {self.num_exploration} run(s){why_out}"
            return choice, BANDIT, None, why
        generation = self.store.generation(conn, self.job_id)
        rng = random.Random(f"{self.seed}:{self.job_id}:{generation}:{len(runs)}")
        choice = bandit.thompson_choice(playing, rng, posterior)
        names = ", ".join(str(a.batch_size) for a in playing)
        why = f"bandit: Thompson sample among {names}{why_out}"
        return choice, BANDIT, None, why

    def _posterior(self, runs: List[RunRow]) -> CostPosterior:
        """The posterior of the finished runs, and of the epoch costs of running ones too.

        Refitted only when either changed.
        """
        finished = [r for r in runs if r.status != RUNNING and r.cost is not None]
        running = [r for r in runs if r.status == RUNNING and r.epoch_cost is not None]
        key = tuple((r.run_id, r.status, r.cost, r.num_epochs) for r in finished) + tuple(
            (r.run_id, f"{r.epoch_cost:.4g}")
            for r in running  # not refitted for rounding
        )
        if self._fitted is not None and self._fitted[0] == key:
            return self._fitted[1]
        posterior = fit_posterior(runs, self.batch_sizes, self.metric_reaches_target)
        self._fitted = (key, posterior)
        return posterior

    def _run_verdict(self, run: RunRow) -> Optional[RunVerdict]:
        unit = run.epoch_cost
        if self.rule_out_probability <= 0 or unit is None or unit <= 0.0:
            return None
        runs = self.store.runs(None, self.job_id)
        key = (run, *runs)
        if self._verdict is None or self._verdict[0] != key:
            self._verdict = (key, self._judge(run, runs, unit))
        return self._verdict[1]

    def _judge(self, run: RunRow, runs: List[RunRow], unit: float) -> Optional[RunVerdict]:
        """:meth:`_run_verdict` on the job's ``runs`` (a pure function of them)."""
        posterior = self._posterior(runs)
        best = best_of(posterior, self.batch_sizes)
        if best is None or best == run.batch_size:
            return None
        bound = self._cost_bound(run.run_id)
        judged = (
            posterior,
            run.batch_size,
            unit,
            run.num_epochs,
            run_budget(self.max_epochs, bound, unit),
            best,
        )
        verdict = run_verdict(*judged, threshold=self.rule_out_probability)
        if verdict is not None:
            return verdict
        other = defer_target(
            self.batch_sizes,
            self.default_batch_size,
            self.num_pruning_rounds,
            runs,
            run,
            self._ruled_out_predicate(runs),
        )
        if other is None:
            return None
        return defer_verdict(
            *judged,
            other,
            threshold=self.rule_out_probability,
            other_max_epochs=self.max_epochs,
            bound=bound,
            after_other=lambda epochs, unit: posterior_after(
                runs,
                run,
                other,
                epochs,
                batch_sizes=self.batch_sizes,
                reaches_target=self.metric_reaches_target,
                target_metric=self.target_metric,
                unit=unit,
            ),
        )

    @staticmethod
    def _arms(runs: List[RunRow], state: PruningState, *, converged_only: bool) -> List[bandit.Arm]:
        if state.done:
            names = list(state.candidates)
        else:
            names = sorted({r.batch_size for r in runs if r.status == REACHED})
        return bandit.arms_from_runs(runs, names, with_failures=not converged_only)


def _why_pruning(state: PruningState, default_batch_size: int, runs: List[RunRow]) -> str:
    """Why the pruning walk tries ``state.next_batch_size`` next."""
    assert state.next_batch_size is not None
    rnd = state.pruning_round
    tried = [r for r in runs if r.phase == PRUNING and r.pruning_round == rnd]
    if not tried:
        origin = (
            f"the default batch size {default_batch_size} or the nearest candidate"
            if rnd == 0
            else f"the cheapest batch size of round {rnd}"
        )
        return f"pruning round {rnd + 1} starts at {origin}"
    start = tried[0].batch_size
    side = "smaller" if state.next_batch_size < start else "larger"
    return (
        f"pruning round {rnd + 1}: next {side} batch size from {start} (that side is cheaper or "
        "the other one ended)"
    )


def _never_ran(run: RunRow) -> bool:
    """A step the walk recorded as ruled out without running it."""
    return run.reason == RULED_OUT and run.num_epochs == 0 and run.cost is None
