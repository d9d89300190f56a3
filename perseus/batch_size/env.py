"""Hand a run chosen outside the training process (the Hydra sweeper) to the training code.

The sweeper starts a run, then sets ``PERSEUS_BSO_DB``, ``PERSEUS_BSO_JOB`` and
``PERSEUS_BSO_RUN_ID`` (and ``PERSEUS_BSO_OPTIONS``: beta, max_epochs) while the job
runs. Inside the job::

    run = current_run()            # None when not launched by the sweeper
    for epoch in ...:
        ...
        if run is not None:
            run.report_epoch(metric, time_s, energy_j)
            if run.should_stop():
                break

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.formats import strict_json

ENV_DB = "PERSEUS_BSO_DB"
ENV_JOB = "PERSEUS_BSO_JOB"
ENV_RUN_ID = "PERSEUS_BSO_RUN_ID"
# Per-run settings not stored with the job (beta, max_epochs, ...), as JSON.
ENV_OPTIONS = "PERSEUS_BSO_OPTIONS"


def run_environment(
    db_path: str, job_id: str, run_id: int, options: Optional[Dict[str, Any]] = None
) -> Dict[str, str]:
    """The variables that identify a run (and the stopping rules the job should apply)."""
    return {
        ENV_DB: db_path,
        ENV_JOB: job_id,
        ENV_RUN_ID: str(run_id),
        ENV_OPTIONS: strict_json.dumps(options or {}, what=ENV_OPTIONS, default=None),
    }


def current_run() -> Optional[BatchSizeOptimizer]:
    """The optimizer attached to the run this process was launched for, or None."""
    db_path, job_id, run_id = (os.environ.get(k) for k in (ENV_DB, ENV_JOB, ENV_RUN_ID))
    if not (db_path and job_id and run_id):
        return None
    options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
    opt = BatchSizeOptimizer.from_db(db_path, job_id, **options)
    opt.resume_run(int(run_id))
    return opt
