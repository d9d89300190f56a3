"""Shared plumbing of the Hydra apps: ``perseus-plan``, ``perseus-train``, ``perseus-server``.

:func:`hydra_app` turns a function ``fn(cfg: PerseusConfig, out_dir: Path)`` into a console-script
``main()``: the config is composed from the packaged ``perseus.conf`` (so the app works from any
working directory), typed and validated once with :func:`perseus.config.validation.to_object`, and a
:class:`~perseus.errors.PerseusError` becomes a one-paragraph message on stderr and exit code 2
instead of a traceback.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from perseus.config.schema import PerseusConfig
from perseus.config.validation import to_object
from perseus.errors import PerseusError

CONFIG_PATH = "pkg://perseus.conf"
ERROR_EXIT_CODE = 2

AppFunction = Callable[[PerseusConfig, Path], Optional[int]]
Converter = Callable[[Any], PerseusConfig]

logger = logging.getLogger(__name__)


def register_resolvers() -> None:
    """The OmegaConf resolvers Perseus's configs use (again in a Slurm job that composes them).

    ``perseus_gpus_per_node``: the GPUs each node's ranks use
    (:func:`perseus.launcher.nodes.gpus_per_node`), for ``hydra/launcher=perseus_slurm``.
    """
    from omegaconf import OmegaConf

    from perseus.launcher.nodes import gpus_per_node

    OmegaConf.register_new_resolver("perseus_gpus_per_node", gpus_per_node, replace=True)


def register_configs(schemas: Optional[Dict[str, Any]] = None) -> None:
    """Register the configuration schema (and an app's own ``schemas``) in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    register_resolvers()

    store = ConfigStore.instance()
    store.store(name="perseus_schema", node=PerseusConfig)
    for name, node in (schemas or {}).items():
        store.store(name=name, node=node)


def run_dir() -> Path:
    """The Hydra run directory (``hydra.run.dir``); the working directory outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def report_error(prog: str, exc: BaseException) -> None:
    """Print ``exc`` as one clean paragraph on stderr (no traceback) and log it."""
    message = str(exc).strip() or type(exc).__name__
    logger.debug("%s failed", prog, exc_info=exc)
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()


def run_app(
    prog: str, fn: AppFunction, raw_cfg: object, convert: Converter = to_object
) -> Optional[int]:
    """Convert ``raw_cfg``, call ``fn(cfg, run_dir())`` and map PerseusError to exit code 2.

    Args:
        prog: The command name used in error messages (``perseus-plan``).
        fn: The app body.
        raw_cfg: The ``DictConfig`` Hydra composed.
        convert: Types and validates it (default :func:`perseus.config.validation.to_object`).

    Returns:
        Whatever ``fn`` returned.

    Raises:
        SystemExit: with code 2 when ``fn`` (or config validation) raised a PerseusError, or with
            ``fn``'s non-zero return value.
    """
    try:
        cfg = convert(raw_cfg)
        code = fn(cfg, run_dir())
    except PerseusError as exc:
        report_error(prog, exc)
        raise SystemExit(ERROR_EXIT_CODE) from None
    if code:
        raise SystemExit(code)
    return code


def hydra_app(
    config_name: str,
    prog: str,
    *,
    schemas: Optional[Dict[str, Any]] = None,
    convert: Converter = to_object,
) -> Callable[[AppFunction], Callable[[], None]]:
    """Decorator making a Hydra console-script ``main`` out of ``fn(cfg, out_dir)``.

    Example::

        @hydra_app("perseus_plan", prog="perseus-plan")
        def main(cfg: PerseusConfig, out_dir: Path) -> None: ...

    Args:
        config_name: Primary config in ``conf/`` (``perseus_plan``, ``perseus_train``, ...).
        prog: Command name for error messages.
        schemas: The app's own structured configs (name -> dataclass), beside
            ``perseus_schema``.
        convert: Turns the composed config into the :class:`PerseusConfig` ``fn`` takes.

    Returns:
        A decorator; the decorated name becomes a no-argument ``main()`` that parses
        ``sys.argv`` the Hydra way (overrides, ``-m``, ``--cfg job``, ``--help``).
    """

    def decorate(fn: AppFunction) -> Callable[[], None]:
        @functools.wraps(fn)
        def task(raw_cfg: object) -> None:
            run_app(prog, fn, raw_cfg, convert)

        @functools.wraps(fn)
        def entry() -> None:
            try:
                import hydra
            except ImportError as exc:
                report_error(prog, MissingExtraError(prog, exc))
                raise SystemExit(ERROR_EXIT_CODE) from None
            register_configs(schemas)
            hydra.main(config_path=CONFIG_PATH, config_name=config_name, version_base=None)(task)()

        return entry

    return decorate


# The pip extra each command needs beyond the core installation.
EXTRA_OF = {"perseus-plan": "planner", "perseus-server": "server", "perseus-train": "train"}


class MissingExtraError(PerseusError):
    """A command's dependencies are not installed (the core installation lacks them)."""

    def __init__(self, prog: str, exc: ImportError) -> None:
        extra = EXTRA_OF.get(prog, "all")
        super().__init__(
            f"{prog} needs packages this installation lacks ({exc}); install them with "
            f"`pip install 'perseus-energy[{extra}]'`"
        )
