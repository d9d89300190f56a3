"""One rank of a 2 stages x 2 replicas gloo world exchanging one iteration's payloads.

Run as ``python exchange_worker.py RANK PORT REPO``; prints one JSON line. Needs only torch and
the core package (it runs under Merak's Python 3.9 / torch 1.10 too).

Rank 0 hosts the world's store, which the other ranks use while they create their stage groups
(``new_group`` waits on it); a stage's exchange does not wait for the other stage. So the ranks
count themselves done on the store and rank 0 leaves last: had it left as soon as its own stage
was done, a rank of the other stage still polling the store got "Connection reset by peer".
"""

import json
import os
import sys
import time
from datetime import timedelta

WORLD = 4


def main() -> None:
    rank, port, repo = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    sys.path.insert(0, repo)
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", int(port), WORLD, rank == 0, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    from perseus.records import StepEnergy
    from perseus.runtime.online import payload as payloads
    from perseus.runtime.online.exchange import torch_stage_exchange
    from perseus.wire import Phase, Schedule

    stage, dp_rank = rank % 2, rank // 2
    clocks = [1410, 1395 - 15 * rank]
    exchange = torch_stage_exchange(rank, stage, dp_rank, 0, clocks, 0.02)
    assert exchange is not None
    size = payloads.payload_size(4, 2)
    upcoming = Schedule(1, Phase.baseline, [1410, 1395, 1410, None])
    mine = payloads.pack(
        size,
        scheduled=True,
        step=2,
        iteration_time_s=1.0 + rank,
        compute_time_s=0.5,
        energies=[StepEnergy(0, 2.0 + rank), StepEnergy(1, 2.5 + rank)],  # now covered
        mismatch=None,
        num_positions=4,
        next_schedule=upcoming if exchange.index == 0 else None,
    )
    everyone = exchange.start(mine).wait()
    nxt = payloads.next_schedule(everyone[0], 4, dp_rank)
    assert nxt is not None
    print(
        json.dumps(
            {
                "rank": rank,
                "index": exchange.index,
                "members": [m.rank for m in exchange.members],
                "clocks": [list(m.clocks_mhz) for m in exchange.members],
                "next": nxt.frequencies_mhz,
                "times": [payloads.measured(p).iteration_time_s for p in everyone],
                "energies": [[list(e) for e in payloads.measured(p).energies] for p in everyone],
            }
        ),
        flush=True,
    )
    store.add("done", 1)
    if rank == 0:  # the store's host leaves last
        deadline = time.monotonic() + 120
        while store.add("done", 0) < WORLD and time.monotonic() < deadline:
            time.sleep(0.01)
    os._exit(0)  # gloo's threads must not meet interpreter finalization


if __name__ == "__main__":
    main()
