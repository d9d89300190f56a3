"""The training frameworks ``perseus-train`` can run, by name: one registry for every dispatch.

Each ``perseus/train/<framework>_job.py`` is a :class:`FrameworkJob`: it exposes ``check(cfg)``
(made by the launcher before any rank starts, and again by every rank) and ``run(cfg)`` (one rank's
training), and may expose ``check_launch(cfg)``: checks of what the ranks will run in (e.g. probing
another interpreter, ``train.python``), made by the launcher only. The launcher's preflight, the
worker and the configuration's :class:`~perseus.config.schema.Framework` choices all go through
:data:`REGISTRY`.

Adding a framework is one entry here (and its member of :class:`~perseus.config.schema.Framework`).
Job modules are imported on first use: they import their framework lazily too.
"""

from __future__ import annotations

import importlib
from typing import Dict, Protocol, cast

from perseus.config.schema import Framework, PerseusConfig
from perseus.errors import ConfigError


class FrameworkJob(Protocol):
    """What ``perseus-train`` needs from one framework (a ``<framework>_job`` module)."""

    def check(self, cfg: PerseusConfig) -> None:
        """Raise :class:`~perseus.errors.ConfigError` naming the fix if ``cfg`` cannot run.

        Cheap: no framework import unless the check needs one.
        """

    def run(self, cfg: PerseusConfig) -> int:
        """Train one rank until the loop stops; return the iterations run."""

    # Optional: ``check_launch(cfg)``, the launcher's checks of the ranks' environment (may
    # start the ranks' interpreter); not part of the protocol so that jobs may leave it out.


REGISTRY: Dict[Framework, str] = {
    Framework.deepspeed: "perseus.train.jobs.deepspeed",
    Framework.megatron: "perseus.train.jobs.megatron",
    Framework.merak: "perseus.train.merak.job",
    Framework.torch: "perseus.train.jobs.torch",
    Framework.torch_pipelining: "perseus.train.jobs.torch_pipelining",
}


def job_for(name: str) -> FrameworkJob:
    """The job of framework ``name``.

    Raises:
        ConfigError: an unknown name.
    """
    try:
        module_name = REGISTRY[Framework(name)]
    except (ValueError, KeyError):
        choices = ", ".join(f.value for f in REGISTRY)
        raise ConfigError(f"framework={name!r}: choose one of {choices}") from None
    module = importlib.import_module(module_name)
    if not (callable(getattr(module, "check", None)) and callable(getattr(module, "run", None))):
        raise TypeError(f"{module_name} must define check(cfg) and run(cfg)")
    return cast(FrameworkJob, module)


def check(cfg: PerseusConfig) -> None:
    """The launcher's checks before any rank starts (``check``, then ``check_launch`` if any)."""
    job = job_for(cfg.framework.name)
    job.check(cfg)
    check_launch = getattr(job, "check_launch", None)
    if check_launch is not None:
        check_launch(cfg)


def run(cfg: PerseusConfig) -> int:
    """Check, then train this rank with the configured framework; returns iterations run."""
    job = job_for(cfg.framework.name)
    job.check(cfg)
    return job.run(cfg)


def require_module(module: str, framework: str, extra: str) -> None:
    """Import ``module`` (the framework itself) or stop with how to install it.

    Raises:
        ConfigError: naming the framework, what failed on import and the pip extra.
    """
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken installation raises more than ImportError
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(
            f"framework={framework} needs {module}, which cannot be imported here "
            f"({type(exc).__name__}: {detail}); install it with "
            f"`pip install 'perseus-energy[{extra}]'` or pick another framework"
        ) from None
