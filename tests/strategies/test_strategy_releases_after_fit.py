"""After ``trainer.fit`` with the strategy, the process holds nothing of the run: the signal
handlers are the ones from before fit, and once the user drops the trainer and the module the
sharded model is freed (on a GPU: the tables' memory comes back for the next fit).

Before, the preemption handler's teardown put back the handler it had found at train start,
Lightning's own (bound to the trainer), after Lightning had already restored its predecessor:
SIGTERM then went to a finished trainer, which kept the whole model alive (26 GiB of tables per
fit of the DLRM-DCNv2 recipe on the H200, until the process ran out of memory).

The fit runs in a spawned rank (as a user's script would be its own process): a process group
and MASTER_PORT left in the test runner would leak into later tests."""

from __future__ import annotations

from pathlib import Path

from dist_ranks import run_ranks
from pipeline_modules import fit, user_module


def _worker(rank: int, root: str) -> dict:
    import gc
    import signal

    from torchrec.distributed import DistributedModelParallel

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    fit(user_module, rank, "sparse_dist", Path(root), devices=1)
    after = {s: signal.getsignal(s) for s in before}
    gc.collect()
    alive = sum(isinstance(o, DistributedModelParallel) for o in gc.get_objects())
    return {"same_handlers": after == before, "alive": alive}


def test_fit_leaves_the_handlers_and_frees_the_model(tmp_path):
    (result,) = run_ranks(_worker, 1, str(tmp_path))
    assert result == {"same_handlers": True, "alive": 0}
