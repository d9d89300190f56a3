"""A job's process that changes its GPUs and then stops answering signals, as a hung rank does.

    python hold_gpus.py STATE_DIR READY_FILE NUM_GPUS

It locks each GPU's SM clock at 1005 MHz and sets a 300 W power limit through Perseus's guard
(which starts its watchdog), writes READY_FILE, then ignores SIGTERM and sleeps: a rank stuck
where no handler runs (a hung collective, a driver call). Cancelled, it outlives Slurm's SIGTERM
(which ends its watchdog) until Slurm kills whatever is left of the job at once with SIGKILL
(after KillWait): nothing of the job restores the GPUs, only the job epilog can.
"""

import signal
import sys
import time
from pathlib import Path

from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU

LOCKED_MHZ = 1005
LIMIT_MW = 300_000


def main() -> None:
    state_dir, ready, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    guards = []
    for index in range(count):
        guard = GPUGuard(NVMLGPU(index), state_dir=state_dir, owner="hold_gpus")
        guard.lock_sm_clocks_mhz(LOCKED_MHZ, LOCKED_MHZ)
        guard.set_power_limit_mw(LIMIT_MW)
        guards.append(guard)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.write_text("changed")
    time.sleep(3600)


if __name__ == "__main__":
    main()
