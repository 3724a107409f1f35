"""After ``trainer.fit`` with the strategy, the process holds nothing of the run: the signal
handlers are the ones from before fit, and once the user drops the trainer and the module the
sharded model is freed (on a GPU: the tables' memory comes back for the next fit).

Before, the preemption handler's teardown put back the handler it had found at train start,
Lightning's own (bound to the trainer), after Lightning had already restored its predecessor:
SIGTERM then went to a finished trainer, which kept the whole model alive (26 GiB of tables per
fit of the DLRM-DCNv2 recipe on the H200, until the process ran out of memory)."""

from __future__ import annotations

import gc
import signal

from pipeline_modules import fit, user_module


def test_fit_leaves_the_handlers_and_frees_the_model(tmp_path):
    from torchrec.distributed import DistributedModelParallel

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    fit(user_module, 0, "sparse_dist", tmp_path, devices=1)
    assert {s: signal.getsignal(s) for s in before} == before
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, DistributedModelParallel)]
    assert not alive
