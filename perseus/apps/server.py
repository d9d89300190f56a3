"""``perseus-server``: the coordination server as a Hydra app.

Run it standalone for a cluster (``perseus-server server.host=0.0.0.0 server.port=7787
server.token=...``); ``perseus-train`` starts one by itself when no ``server.url`` is set.
Job files and the state file (``state.sqlite``: a restart on the same ``server.dump_dir`` goes
on with every job) go to ``server.dump_dir`` (default: ``<run dir>/jobs``). Only the ``server``
group configures it: a job's own settings (energy policy, profiler, solver) come with the job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from perseus.apps.common import hydra_app
from perseus.config.schema import PerseusConfig, ServerConfig
from perseus.config.validation import validate
from perseus.errors import ConfigError

logger = logging.getLogger(__name__)

SCHEMA_NAME = "perseus_server_schema"


@dataclass
class ServerAppConfig:
    """What ``perseus-server`` reads: the ``server`` group (any other key is an error)."""

    server: ServerConfig = field(default_factory=ServerConfig)


def to_server_config(raw: Any) -> PerseusConfig:
    """The composed ``perseus_server`` config as a validated :class:`PerseusConfig`."""
    from omegaconf import OmegaConf

    obj = raw if isinstance(raw, ServerAppConfig) else OmegaConf.to_object(raw)
    if not isinstance(obj, ServerAppConfig):
        raise ConfigError(f"expected the perseus-server config, got {type(obj).__name__}")
    cfg = PerseusConfig(server=obj.server)
    validate(cfg)
    return cfg


def run_server(cfg: PerseusConfig, out_dir: Path) -> Optional[int]:
    """Serve until interrupted; a start-up problem is a ConfigError (one line)."""
    from perseus.server.process import serve

    dump_dir = Path(cfg.server.dump_dir) if cfg.server.dump_dir else out_dir / "jobs"

    def ready(url: str) -> None:
        logger.info("perseus-server at %s, job files under %s", url, dump_dir)

    serve(cfg.server, dump_dir, on_ready=ready)
    return None


main = hydra_app(
    "perseus_server",
    prog="perseus-server",
    schemas={SCHEMA_NAME: ServerAppConfig},
    convert=to_server_config,
)(run_server)


if __name__ == "__main__":
    main()
