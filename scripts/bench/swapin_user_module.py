"""A user's own Lightning DLRM-DCNv2 trainer with rocmtrain's strategy swapped in by name.

Written the way a TorchRec user writes a LightningModule, without rocmtrain's model code: torchrec's
``DLRMTrain(DLRM_DCN(...))`` with the tables on the meta device, the row-wise Adagrad of the tables
fused into the backward (``apply_optimizer_in_backward``), dense Adagrad from
``configure_optimizers``, a plain ``training_step(batch, batch_idx)``, and

    import rocmtrain  # registers strategy="torchrec"
    pl.Trainer(strategy="torchrec", accelerator="gpu", devices=1, precision="bf16-mixed")

MLPerf DLRM-DCNv2 shapes (26 tables D=128, multi-hot, rows capped at --rows-cap), B=65536.
``--compile`` compiles the DCN cross net in place (``crossnet.compile()``, what the tuned plain
TorchRec anchor does). Throughput: ``ThroughputCallback`` (rocmtrain/callbacks/throughput.py) writes
``<run-dir>/throughput.json`` (median samples/s over synced windows after --warmup steps, peak
memory), the file ``e2e_summary.py`` reads, and the last line printed is
``samples/s <rate> step_ms <ms> peak_gib <GiB>``.

Data (--data planted, default): the anchor's batches (rocmtrain.data's planted-signal generator,
the only other rocmtrain code used, as in e2e_torchrec_anchor.py), so the two are compared on the
same ids; --data uniform: the script's own uniform ids and random labels. --n-batches distinct
batches are made once; --feed staged (default) pins them once and cycles them, --feed loader
feeds new CPU copies of them through an ordinary ``DataLoader(pin_memory=True)`` every step.

    python scripts/bench/swapin_user_module.py --out-dir /tmp/swapin [--compile]
    python scripts/bench/swapin_user_module.py --cpu-smoke --out-dir /tmp/swapin_smoke
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import rocmtrain  # noqa: F401  (registers strategy="torchrec")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_feed import ordinary_loader  # noqa: E402

from rocmtrain.callbacks.throughput import ThroughputCallback  # noqa: E402

MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
        2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]  # fmt: skip


class DLRMDCNv2(pl.LightningModule):
    """torchrec's DLRMTrain(DLRM_DCN) as a LightningModule."""

    def __init__(self, rows: list[int], dim: int, small: bool, lr: float, compile_dcn: bool):
        super().__init__()
        self.lr = lr
        tables = [
            EmbeddingBagConfig(
                name=f"t_cat_{i}", embedding_dim=dim, num_embeddings=r, feature_names=[f"cat_{i}"]
            )
            for i, r in enumerate(rows)
        ]
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.model = DLRMTrain(
            DLRM_DCN(
                embedding_bag_collection=ebc,
                dense_in_features=13,
                dense_arch_layer_sizes=[32, dim] if small else [512, 256, dim],
                over_arch_layer_sizes=[32, 16, 1] if small else [1024, 1024, 512, 256, 1],
                dcn_num_layers=3,
                dcn_low_rank_dim=16 if small else 512,
            )
        )
        if compile_dcn:
            self.model.model.inter_arch.crossnet.compile()
        apply_optimizer_in_backward(
            RowWiseAdagrad, self.model.model.sparse_arch.parameters(), {"lr": lr, "eps": 1e-8}
        )

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, _ = self.model(batch)
        self.log("train_loss", loss.detach(), batch_size=batch.labels.shape[0])
        return loss

    def configure_optimizers(self):
        dense = dict(in_backward_optimizer_filter(self.named_parameters()))
        return torch.optim.Adagrad(dense.values(), lr=self.lr, eps=1e-8)


class Cycled(Dataset):
    """``steps`` batches cycling over a few pre-made ones."""

    def __init__(self, batches: list[Batch], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> Batch:
        return self.batches[i % len(self.batches)]


def uniform_batches(n: int, batch: int, rows: list[int], seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        values = [
            torch.randint(0, r, (batch * h,), generator=g)
            for r, h in zip(rows, MULTI_HOT, strict=True)
        ]
        lengths = [torch.full((batch,), h, dtype=torch.int32) for h in MULTI_HOT]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"cat_{i}" for i in range(len(rows))],
            values=torch.cat(values),
            lengths=torch.cat(lengths),
        )
        labels = (torch.rand(batch, generator=g) < 0.25).float()
        out.append(Batch(torch.randn(batch, 13, generator=g), kjt, labels))
    return out


def planted_batches(n: int, batch: int, rows: list[int], seed: int) -> list[Batch]:
    from rocmtrain.config.data import DataConfig
    from rocmtrain.data.synthetic import synthetic_factory

    cfg = DataConfig(batch_size=batch, num_train_batches=n, num_val_batches=1, cache_batches=n)
    source = synthetic_factory(cfg, rows=rows, multi_hot=MULTI_HOT, num_dense=13, seed=seed)(
        "train", 0, 1
    )
    return [source.block(b) for b in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out-dir", required=True, help="throughput.json goes here")
    p.add_argument("--compile", action="store_true", help="crossnet.compile() in place")
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--rows-cap", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=50, help="measured steps after the warm-up")
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--sync-every", type=int, default=5)
    p.add_argument("--n-batches", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data", choices=("planted", "uniform"), default="planted")
    p.add_argument(
        "--feed",
        choices=("staged", "loader"),
        default="staged",
        help="staged: --n-batches batches pinned once and cycled; loader: an ordinary "
        "DataLoader(pin_memory=True) yielding new CPU copies of them every step (e2e_feed.py)",
    )
    p.add_argument("--no-pin", action="store_true", help="--feed loader with pin_memory=False")
    p.add_argument(
        "--feeds",
        default=None,
        help="several feeds in one process, e.g. loader,staged: each round fits a new module "
        "and Trainer per feed; results in OUT_DIR/<feed>_r<k>/throughput.json",
    )
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of --feeds")
    p.add_argument(
        "--sync-report",
        action="store_true",
        help="record the host-device syncs of steps 9-12 (inside the warm-up) to "
        "OUT_DIR/syncs/ with rocmtrain's SyncReportCallback, as a user adds a callback",
    )
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes (D=16, small MLPs, 2000 rows, B=256), accelerator=cpu, 1 device",
    )
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.batch_size, args.rows_cap, args.dim = 256, 2000, 16
        args.steps, args.warmup, args.sync_every, args.n_batches = 4, 2, 2, 2
    rows = [min(r, args.rows_cap) for r in ROWS]
    make = planted_batches if args.data == "planted" else uniform_batches
    batches = make(args.n_batches, args.batch_size, rows, args.seed)
    gpu = not args.cpu_smoke
    staged = [b.pin_memory() for b in batches] if gpu else batches
    feeds = args.feeds.split(",") if args.feeds else [args.feed]
    for feed in feeds:
        if feed not in ("staged", "loader"):
            p.error(f"--feeds {args.feeds}: each feed is staged or loader")
    one = args.rounds == 1 and len(feeds) == 1
    for k in range(1, args.rounds + 1):
        for feed in feeds:  # interleaved: round k of every feed before round k + 1
            out = Path(args.out_dir) if one else Path(args.out_dir) / f"{feed}_r{k}"
            fit_once(args, rows, staged if feed == "staged" else batches, feed, out, gpu)
    return 0


def fit_once(args, rows, batches, feed: str, out_dir: Path, gpu: bool) -> dict:
    """One fit of a new module and Trainer fed ``feed``; ``out_dir/throughput.json``."""
    pl.seed_everything(args.seed, verbose=False)
    module = DLRMDCNv2(rows, args.dim, args.cpu_smoke, args.lr, args.compile)
    throughput = ThroughputCallback(out_dir, warmup_steps=args.warmup, sync_every=args.sync_every)
    callbacks: list[pl.Callback] = [throughput]
    if args.sync_report:
        from rocmtrain.callbacks.syncs import SyncReportCallback

        callbacks.append(SyncReportCallback(out_dir, start_step=9, steps=4))
    trainer = pl.Trainer(
        strategy="torchrec",
        accelerator="gpu" if gpu else "cpu",
        devices=1,
        precision="bf16-mixed",
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    steps = args.warmup + args.steps
    if feed == "loader":  # an ordinary DataLoader, new CPU batches every step
        loader = ordinary_loader(batches, steps, pin_memory=not args.no_pin and gpu)
    else:  # pre-staged: a few batches pinned once and cycled
        loader = DataLoader(Cycled(batches, steps), batch_size=None)
    trainer.fit(module, loader)
    doc = throughput.summary(trainer, module)
    if trainer.is_global_zero:
        peak = max(doc["peak_mem_alloc_gib_per_rank"] or [0.0])
        rate, step_ms = doc["samples_per_s"], doc["step_ms_median"]
        print(f"{feed} {out_dir.name}: samples/s {rate or float('nan'):.0f} "
              f"step_ms {step_ms or float('nan'):.2f} peak_gib {peak:.2f}", flush=True)  # fmt: skip
    del trainer, module, loader
    gc.collect()  # reference cycles (hooks, closures) would keep the sharded tables alive
    if gpu:
        torch.cuda.empty_cache()  # the next fit allocates its tables anew
        print(f"after {feed} {out_dir.name}: {torch.cuda.memory_allocated() / 2**30:.2f} GiB "
              "still allocated", flush=True)  # fmt: skip
    return doc


if __name__ == "__main__":
    raise SystemExit(main())
