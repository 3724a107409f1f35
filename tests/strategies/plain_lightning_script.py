"""A plain Lightning script (no Hydra, no rocmtrain config) that swaps in rocmtrain's TorchRec
strategy by name. Run by test_strategy_plain_lightning.py as a real 2-process job:

    python plain_lightning_script.py OUT.json [strategy-name | object] [stall]

``object`` passes ``TorchRecStrategy(sharding_type="table_wise", watchdog={"hang_timeout_seconds":
15})`` instead of a name; ``stall[=N]`` makes rank 1 stop making progress inside ``training_step``
at step N (default 3); ``raise0`` makes rank 0 alone raise at step 3, then clean up for a few seconds. Lightning starts rank 1 by re-running this script (its subprocess launcher), like ``ddp``.
"""

from __future__ import annotations

import atexit
import json
import sys
import time

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import rocmtrain  # registers the "torchrec*" strategy names

F, ROWS, D = 4, 64, 8


class TinyRec(pl.LightningModule):
    """Any LightningModule holding an EmbeddingBagCollection (tables on the meta device)."""

    def __init__(self, stall_at: int | None = None, raise_at: int | None = None) -> None:
        super().__init__()
        self.stall_at = stall_at
        self.raise_at = raise_at
        tables = [
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=D, num_embeddings=ROWS, feature_names=[f"f{i}"]
            )
            for i in range(F)
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        apply_optimizer_in_backward(torch.optim.Adagrad, self.ebc.parameters(), {"lr": 0.5})
        self.head = torch.nn.Linear(F * D, 1)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0 and self.global_step == self.raise_at:
            raise RuntimeError("rank 0 fails alone")
        if self.global_rank == 1 and self.global_step == self.stall_at:
            print("rank 1 stalls in training_step", file=sys.stderr, flush=True)
            time.sleep(600)
        ids, y = batch
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(F)],
            values=ids.t().reshape(-1),
            lengths=torch.ones(ids.numel(), dtype=torch.int32),
        )
        logits = self.head(self.ebc(kjt).values()).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.head.parameters(), lr=0.05)


class UserCallback(pl.Callback):
    """The user's own callback: after fit the trainer's list holds it and Lightning's, no more."""


def _names(callbacks: list) -> list[str]:
    return [f"{type(c).__module__}.{type(c).__qualname__}" for c in callbacks]


def _record_group_at_exit(out: str, rank: list[int]) -> None:
    """Runs after the strategy's exit handler (registered later, so run first): is the process
    group still alive when the interpreter starts its teardown?"""
    import torch.distributed as dist

    with open(f"{out}.exit.rank{rank[0]}", "w") as f:
        json.dump({"initialized_at_exit": dist.is_initialized()}, f)


def main() -> None:
    out, name = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "torchrec_table_wise")
    rank = [0]
    atexit.register(_record_group_at_exit, out, rank)
    stalls = [a for a in sys.argv[3:] if a.startswith("stall")]
    stall_at = int(stalls[0].partition("=")[2] or 3) if stalls else None
    raise_at = 3 if "raise0" in sys.argv[3:] else None
    strategy: object = name
    if name == "object":
        strategy = rocmtrain.TorchRecStrategy(
            sharding_type="table_wise", watchdog={"hang_timeout_seconds": 15}
        )
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ROWS, (2048, F), generator=g)
    y = (ids[:, 0] < ROWS // 2).float()  # the label is a function of feature f0's id
    loader = DataLoader(TensorDataset(ids, y), batch_size=64, shuffle=False)
    model = TinyRec(stall_at=stall_at, raise_at=raise_at)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[UserCallback()],
    )
    callbacks_before = _names(trainer.callbacks)
    try:
        trainer.fit(model, loader)
    finally:
        if raise_at is not None:  # the script's own cleanup (uploading logs ...) takes a while
            time.sleep(7)
    rank[0] = trainer.global_rank
    strategy = trainer.strategy
    plan = {
        t: (ps.sharding_type, ps.ranks)
        for m in strategy.sharding_plan.plan.values()
        for t, ps in m.items()
    }
    local = {
        k: [tuple(s.tensor.shape) for s in v.local_shards()]
        for k, v in model.ebc.state_dict().items()
    }
    result = dict(
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        strategy=type(strategy).__name__,
        plan=plan,
        local_shards=local,
        losses=model.losses,
        callbacks_before=callbacks_before,
        callbacks_after=_names(trainer.callbacks),
    )
    with open(f"{out}.rank{trainer.global_rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
