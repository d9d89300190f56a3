"""Run a training script unchanged, then end the rank as perseus-train ends its ranks.

    torchrun --nproc-per-node 2 run_script.py SCRIPT [ARGS...]

The script runs as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` as if started directly.
Once it returns, the rank ends through :func:`perseus.process_exit.exit_without_finalizing`:
non-daemon threads joined, every exit hook run (Perseus's closers among them) while the
interpreter is fully alive, then ``os._exit``. Interpreter finalization is what this avoids: a
DeepSpeed job's gloo worker threads outlive ``destroy_process_group``, and one that releases a
tensor just as the interpreter finalizes aborts the process ("terminate called without an
active exception", SIGABRT) after a successful run, with or without Perseus. A script that
raises, or exits with a non-zero status, ends as it would without this wrapper.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    from perseus.process_exit import exit_without_finalizing

    exit_without_finalizing(0)


if __name__ == "__main__":
    main()
