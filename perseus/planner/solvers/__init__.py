"""Solver registry: ``planner.solver`` names a solver registered here.

Built-in solvers:

* ``lp`` (:mod:`.lp`): the default. Solves the convex-hull linear program (minimum energy
  subject to iteration time <= T) with HiGHS for a sweep of deadlines, warm-starting each
  deadline from the last, then turns every LP solution into a real plan (rounding to profiled
  frequencies and filling the remaining slack). Seconds for 8 stages x 96 microbatches.
* ``lowtime``: the reference planner's time-cost trade-off algorithm through the lowtime
  library (slow; for comparison).
* ``exact``: a mixed-integer program over every frequency choice (tiny problems only; used to
  validate the others).

Third-party solvers register with :func:`register_solver`.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Type, TypeVar

from perseus.errors import ConfigError
from perseus.planner.solvers.base import Progress, Solver

__all__ = [
    "Progress",
    "Solver",
    "available_solvers",
    "get_solver",
    "register_solver",
    "solver_accepts",
]

_REGISTRY: Dict[str, Type[Solver]] = {}
# Built-ins are imported on first use (they pull in numpy/scipy/highspy/lowtime).
_BUILTIN = {
    "lp": "perseus.planner.solvers.lp",
    "lowtime": "perseus.planner.solvers.lowtime_solver",
    "exact": "perseus.planner.solvers.exact",
}

S = TypeVar("S", bound=Type[Solver])


def register_solver(name: str) -> Callable[[S], S]:
    """Class decorator registering a :class:`Solver` under ``name``."""

    def wrap(cls: S) -> S:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_solvers() -> List[str]:
    """Names accepted by :func:`get_solver`."""
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def solver_accepts(name: str, option: str) -> bool:
    """Whether the named solver's constructor takes ``option`` (e.g. ``effort``).

    Raises:
        ConfigError: unknown name (as :func:`get_solver`).
    """
    import inspect

    return option in inspect.signature(_solver_class(name).__init__).parameters


def get_solver(name: str, **kwargs: object) -> Solver:
    """Instantiate the solver registered as ``name`` (keyword arguments go to its class).

    Raises:
        ConfigError: unknown name (the message lists the choices).
    """
    return _solver_class(name)(**kwargs)


def _solver_class(name: str) -> Type[Solver]:
    """The class registered as ``name`` (built-ins imported on first use)."""
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        raise ConfigError(
            f"planner.solver={name!r}: unknown solver; choose one of {available_solvers()}"
        )
    return _REGISTRY[name]
