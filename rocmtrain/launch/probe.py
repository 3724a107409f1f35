"""Rank probe: check a Slurm job's rank wiring without training (one JSON file per rank).

Run as the program of every task of a job (what the Slurm tests do, and a quick check on a new
cluster)::

    srun python -m rocmtrain.launch.probe run_dir=$PWD/probe [--requeue-once] [any tokens...]

Each rank reads rank / world size / master address from Lightning's ``SLURMEnvironment``, binds
itself (:func:`rocmtrain.launch.binding.bind_local_rank`), joins a gloo process group, all-reduces
``rank + 1`` and writes ``<run_dir>/probe-rank<R>-restart<K>.json`` with all of it and its argv.
``--requeue-once`` makes every rank exit 75 (``exit_codes.REQUEUE``) on the first run of the job
(``SLURM_RESTART_COUNT`` unset or 0) and 0 after a requeue.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

from rocmtrain import exit_codes


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist
    from lightning_fabric.plugins.environments import SLURMEnvironment

    from rocmtrain.launch.binding import bind_local_rank

    out = Path(next((a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")), "."))
    env = SLURMEnvironment(auto_requeue=False)
    rank, world = env.global_rank(), env.world_size()
    addr, port = env.main_address, env.main_port
    binding = bind_local_rank(env.local_rank(), accelerator="cpu")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    record = {
        "argv": argv,
        "rank": rank,
        "world_size": world,
        "local_rank": env.local_rank(),
        "node_rank": env.node_rank(),
        "main_address": addr,
        "main_port": port,
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "job_name": os.environ.get("SLURM_JOB_NAME"),
        "restart": restart,
        "allreduce": value.item(),
        "binding": binding.describe(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"probe-rank{rank}-restart{restart}.json").write_text(json.dumps(record, indent=1))
    print(f"probe: rank {rank}/{world} on {record['node']}: all_reduce {value.item()}", flush=True)
    if "--requeue-once" in argv and restart == 0:
        return exit_codes.REQUEUE
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
