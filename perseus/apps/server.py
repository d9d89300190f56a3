"""``perseus-server``: the coordination server as a Hydra app.

Run it standalone for a cluster (``perseus-server server.host=0.0.0.0 server.port=7787
server.token=...``); ``perseus-train`` starts one by itself when no ``server.url`` is set.
Job files go to ``server.dump_dir`` (default: ``<run dir>/jobs``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from perseus.apps.common import hydra_app
from perseus.config import PerseusConfig

logger = logging.getLogger(__name__)


def run_server(cfg: PerseusConfig, out_dir: Path) -> Optional[int]:
    """Serve until interrupted; raises ConfigError for an unsafe exposure."""
    from perseus.server.process import check_exposure, serve

    check_exposure(cfg.server)
    dump_dir = Path(cfg.server.dump_dir) if cfg.server.dump_dir else out_dir / "jobs"
    logger.info(
        "perseus-server on %s:%d, job files under %s", cfg.server.host, cfg.server.port, dump_dir
    )
    serve(cfg.server, dump_dir)
    return None


main = hydra_app("perseus_server", prog="perseus-server")(run_server)


if __name__ == "__main__":
    main()
