"""``python -m rocmtrain ...`` plus a throughput record: the rocmtrain side of bench_e2e_gpu.sh.

    python scripts/bench/e2e_rocmtrain_run.py recipe=dlrm_dcnv2_h200 kernel=fbgemm precision=bf16

Runs the real command line (``rocmtrain.cli.hydra_main``: Hydra recipe -> train(cfg) ->
Lightning + TorchRecStrategy) with two additions, both applied in every rank (Lightning re-runs
this script for ranks > 0):

- :class:`e2e_throughput.ThroughputCallback` appended to the run's callbacks ->
  ``<run_dir>/throughput.json`` (median samples/s over synced windows after warm-up, peak memory
  per rank, per-epoch history incl. val AUC). ``E2E_WARMUP_STEPS`` (15), ``E2E_SYNC_EVERY`` (5).
- ``torchmetrics.classification.BinaryAUROC`` replaced by ``rocmtrain.metrics.BinnedBinaryAUROC``
  (identical state and values; torchmetrics' own binned update loops over all thresholds for
  batches > 50k samples, ~40k kernel launches per step at 10k thresholds). Set ``E2E_FAST_AUC=0``
  to measure without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str]) -> int:
    import torchmetrics.classification
    from e2e_throughput import ThroughputCallback

    import rocmtrain.train as train_mod
    from rocmtrain.cli import hydra_main
    from rocmtrain.metrics import BinnedBinaryAUROC

    if os.environ.get("E2E_FAST_AUC", "1") != "0":
        torchmetrics.classification.BinaryAUROC = BinnedBinaryAUROC
    warmup = int(os.environ.get("E2E_WARMUP_STEPS", "15"))
    sync_every = int(os.environ.get("E2E_SYNC_EVERY", "5"))
    original = getattr(train_mod, "_monitor_callbacks", None)
    if original is None:
        raise SystemExit(
            "e2e_rocmtrain_run.py: rocmtrain.train._monitor_callbacks(cfg, run_dir) is gone; "
            "update the hook this runner wraps to add ThroughputCallback"
        )

    def callbacks(cfg, run_dir):
        extra = ThroughputCallback(
            run_dir, warmup_steps=warmup, sync_every=sync_every, batch_per_rank=cfg.data.batch_size
        )
        return [*original(cfg, run_dir), extra]

    train_mod._monitor_callbacks = callbacks
    return hydra_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
