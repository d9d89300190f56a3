"""The ``POST /jobs`` body of a job, built from its configuration.

The wire's models know nothing of the configuration; the runtime (and the launcher's check,
which runs the same function before step 1) fills them from the configuration keys of the same
names.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Tuple, Type, Union

from perseus.errors import ConfigError
from perseus.pipeline_order import PipelineOrder
from perseus.records import RankInfo
from perseus.schedule import pipeline_order
from perseus.wire import EnergySettings, JobSpec, ProfilerSettings

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

# The schedules the coordination server generates from their name.
GENERATED: Tuple[Literal["1f1b", "gpipe"], ...] = ("1f1b", "gpipe")


def job_spec_from_config(
    cfg: PerseusConfig, rank: RankInfo, job_id: Optional[str] = None
) -> JobSpec:
    """The ``POST /jobs`` body of this job (its shape as the engine runs it, see ``job_shape``).

    ``job_id``: the launch's job (see :mod:`perseus.runtime.launch.rendezvous`); ``None`` for
    checks. ``planner.p2p_power_w`` is sent as the mean when it is one value per stage.

    Raises:
        ConfigError: a schedule or energy policy the coordination server does not serve, or a
            value outside the server's bounds.
    """
    par = cfg.parallelism
    schedule = _schedule(par.schedule, rank)
    p2p = cfg.planner.p2p_power_w
    p2p_w = float(p2p) if isinstance(p2p, (int, float)) else sum(p2p) / max(1, len(p2p))
    try:
        return JobSpec(
            job_id=job_id,
            num_stages=rank.num_stages,
            num_microbatches=par.num_microbatches,
            schedule=schedule,
            dp=par.dp,
            tp=par.tp,
            energy=EnergySettings(**_same_named(EnergySettings, cfg.energy)),
            profiler=ProfilerSettings(**_same_named(ProfilerSettings, cfg.profiler)),
            solver=cfg.planner.solver,
            p2p_power_w=p2p_w,
        )
    except ValueError as exc:
        raise ConfigError(f"runtime.mode=online: {exc}") from None


def _schedule(name: str, rank: RankInfo) -> Union[Literal["1f1b", "gpipe"], PipelineOrder]:
    """The job's schedule as the server takes it: ``1f1b``/``gpipe``, or the engine's order.

    An engine that gives its order (``torch.distributed.pipelining``) sends it, unless it is
    the order Perseus generates for the schedule's name (the server then plans that order
    with everything it knows about it).
    """
    if rank.order is not None:
        order = PipelineOrder(rank.schedule or "custom", list(rank.order))
        for generated in GENERATED:
            if order == pipeline_order(generated, order.num_ranks, order.num_microbatches):
                return generated
        return order
    if name not in GENERATED or rank.num_model_chunks != 1:
        raise ConfigError(
            f"runtime.mode=online supports parallelism.schedule=1f1b or gpipe with one model "
            f"chunk, or any schedule of an engine that gives its own order "
            f"(torch.distributed.pipelining), not {name!r} here; profile offline and use "
            "runtime.mode=plan instead"
        )
    return "gpipe" if name == "gpipe" else "1f1b"


def _same_named(model: Type[Any], section: Any) -> Dict[str, Any]:
    """The values of ``section`` (a config dataclass) for the fields ``model`` has."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(model)}
