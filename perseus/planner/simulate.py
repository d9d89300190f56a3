"""Re-simulation: how a plan is judged (DESIGN §5).

Iteration time ``T`` is the longest path through the dependency DAG with every instruction
taking its measured time at its assigned frequency (each instruction starts as soon as its
predecessors end). Energy is::

    E = sum(instruction energies) + sum over stages s of P_block[s] * (T - busy_s)

where ``busy_s`` is the total compute time of stage ``s``: a GPU that is not computing is
blocked on communication (or waiting for the iteration to end) at ``P_block``. With one
``P_block`` this is ``sum(e) + P_block * (num_stages * T - sum(t))``.

:func:`simulate_choices` evaluates many plans at once: one vectorised step per DAG level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from perseus.planner.problem import Freqs, PlanningProblem

# Plans per vectorised batch (bounds memory: batch x nodes floats).
_BATCH = 512


@dataclass
class SimResult:
    """A re-simulated plan.

    Attributes:
        iteration_time_s: Longest path through the DAG.
        energy_j: Instruction energies plus blocking energy.
        start_s: Per stage, start time of each instruction in execution order.
        end_s: Per stage, end time of each instruction in execution order.
    """

    iteration_time_s: float
    energy_j: float
    start_s: List[List[float]]
    end_s: List[List[float]]


def simulate(problem: PlanningProblem, freqs: Freqs) -> SimResult:
    """Re-simulate one plan given as per-stage frequencies in execution order.

    Raises:
        ConfigError: if the plan does not fit the problem's schedule or uses a frequency
            that was not profiled.
    """
    choices = problem.freqs_to_choices(freqs)
    times, _ = node_costs(problem, choices[None, :])
    finish = earliest_finish(problem, times)[0]
    total_t, total_e = simulate_choices(problem, choices[None, :])
    start = finish - times[0]
    off = problem.dag.offsets
    return SimResult(
        iteration_time_s=float(total_t[0]),
        energy_j=float(total_e[0]),
        start_s=[start[off[s] : off[s + 1]].tolist() for s in range(problem.num_stages)],
        end_s=[finish[off[s] : off[s + 1]].tolist() for s in range(problem.num_stages)],
    )


def node_costs(problem: PlanningProblem, choices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Time (s) and energy (J) of every node of every plan; ``choices`` is (plans, nodes)."""
    groups = problem.node_group[None, :]
    return problem.opt_time[groups, choices], problem.opt_energy[groups, choices]


def earliest_finish(problem: PlanningProblem, times: np.ndarray) -> np.ndarray:
    """Earliest finish time of every node, (plans, nodes), for node durations ``times``."""
    dag = problem.dag
    num_plans, num_nodes = times.shape
    # Column ``num_nodes`` stays 0: predecessor index -1 reads it.
    finish = np.zeros((num_plans, num_nodes + 1))
    for level in dag.levels:
        ready = np.maximum(finish[:, dag.stage_pred[level]], finish[:, dag.flow_pred[level]])
        finish[:, level] = ready + times[:, level]
    return finish[:, :num_nodes]


def latest_finish(
    problem: PlanningProblem, times: np.ndarray, deadline_s: np.ndarray
) -> np.ndarray:
    """Latest finish time of every node, (plans, nodes), so that every plan meets its deadline.

    Args:
        problem: The planning problem.
        times: (plans, nodes) durations.
        deadline_s: Per plan, the time by which every sink must finish.
    """
    dag = problem.dag
    num_nodes = times.shape[1]
    # Column ``num_nodes`` absorbs writes to predecessor index -1.
    latest = np.repeat(np.asarray(deadline_s, dtype=float)[:, None], num_nodes + 1, axis=1)
    for level in reversed(dag.levels):
        late_start = latest[:, level] - times[:, level]
        for pred in (dag.stage_pred[level], dag.flow_pred[level]):
            scatter_min(latest, pred, late_start)
    return latest[:, :num_nodes]


def scatter_min(target: np.ndarray, columns: np.ndarray, values: np.ndarray) -> None:
    """``target[:, columns] = min(target[:, columns], values)``, repeated columns included."""
    np.minimum.at(target.T, columns, values.T)


def simulate_choices(
    problem: PlanningProblem, choices: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """Iteration time (s) and energy (J) of many plans given as option indices (plans, nodes)."""
    choices = np.atleast_2d(choices)
    out_t = np.empty(choices.shape[0])
    out_e = np.empty(choices.shape[0])
    power = np.asarray(problem.p2p_power_w)
    for lo in range(0, choices.shape[0], _BATCH):
        batch = choices[lo : lo + _BATCH]
        times, energies = node_costs(problem, batch)
        total_t = earliest_finish(problem, times)[:, problem.dag.sinks].max(axis=1)
        busy = np.add.reduceat(times, problem.dag.offsets[:-1], axis=1)
        blocking = (power[None, :] * (total_t[:, None] - busy)).sum(axis=1)
        out_t[lo : lo + _BATCH] = total_t
        out_e[lo : lo + _BATCH] = energies.sum(axis=1) + blocking
    return out_t, out_e


def iteration_time(problem: PlanningProblem, times: np.ndarray) -> float:
    """Longest path for one vector of node durations (s)."""
    return float(earliest_finish(problem, times[None, :])[0, problem.dag.sinks].max())
