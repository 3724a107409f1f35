"""Atomic, sharded checkpoints and resume discovery.

Layout of a checkpoint root (``cfg.checkpoint.dir``, default ``<run_dir>/checkpoints``)::

    checkpoints/
      step-000000200/            one complete checkpoint (name: optimizer step, zero-padded)
        .metadata                torch.distributed.checkpoint (DCP) metadata (rank 0)
        __0_0.distcp __1_0.distcp  DCP shards: model (sharded tables + dense), fused optimizer
        rank_0.pt rank_1.pt      per-rank torch.save: dense optimizer, loops, data position, RNG
        COMPLETE.json            completion marker: file list + sizes (written last)
      .step-000000300.tmp/       a write in progress or killed mid-write (never loaded)

Write protocol (:func:`write_sharded`, collective): rank 0 creates ``.<name>.tmp``; barrier;
every rank writes its parts; barrier; rank 0 fsyncs every file, writes ``COMPLETE.json``, fsyncs
it, renames the folder to ``<name>`` and fsyncs the root; barrier. A crash at any point leaves
either the previous checkpoints untouched or a ``.tmp`` folder that :func:`find_resume` ignores.

API (all paths are ``pathlib.Path``):

- ``save(trainer, root=None, keep_last=None) -> Path``: collective, at a step boundary: write a
  checkpoint of the running ``trainer`` (strategy ``TorchRecStrategy``) into ``root`` and prune
  to the newest ``keep_last``. Used by :class:`AtomicCheckpoint` and by the watchdog on SIGTERM.
- ``find_resume(root) -> Path | None``: newest complete, intact checkpoint (marker present,
  every listed file present with its recorded size); partial/corrupt ones are skipped with a
  warning and the previous one is used.
- ``is_complete(path) -> bool``, ``list_checkpoints(root)``, ``prune(root, keep_last)``,
  ``remove(path)``.
- ``AtomicCheckpoint(root, every_n_train_steps=..., every_n_epochs=..., keep_last=...)``: the
  Lightning callback ``train(cfg)`` attaches.

Resume: ``trainer.fit(module, datamodule=dm, ckpt_path=find_resume(root))`` restores the sharded
tables, the fused embedding optimizer state, the dense optimizer, Lightning's loops (epoch and
batch), the datamodule's data position (its ``state_dict``) and every rank's RNG.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
PREFIX = "step-"
FORMAT_VERSION = 1


def checkpoint_name(global_step: int) -> str:
    return f"{PREFIX}{global_step:09d}"


def _tmp_for(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_sharded(
    final: Path,
    *,
    sharded: dict[str, Any],
    per_rank: dict[str, Any],
    rank: int,
    world_size: int,
    barrier: Callable[[], None],
) -> Path:
    """Collective atomic write of ``sharded`` (DCP) and this rank's ``per_rank`` dict."""
    import torch.distributed.checkpoint as dcp

    final = Path(final)
    tmp = _tmp_for(final)
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    dcp.save(sharded, checkpoint_id=str(tmp))
    torch.save(per_rank, tmp / f"rank_{rank}.pt")
    barrier()
    if rank == 0:
        files = {}
        for f in sorted(tmp.iterdir()):
            _fsync_path(f)
            files[f.name] = f.stat().st_size
        marker = {
            "format": FORMAT_VERSION,
            "world_size": world_size,
            "global_step": per_rank.get("global_step"),
            "epoch": per_rank.get("epoch"),
            "time": time.time(),
            "files": files,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        _fsync_path(tmp / MARKER)
        _fsync_path(tmp)
        if final.exists():  # same step written twice (e.g. epoch end == step interval)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_path(final.parent)
    barrier()
    return final


def read_sharded(path: Path, *, sharded: dict[str, Any], rank: int) -> dict[str, Any]:
    """Load DCP state into ``sharded`` (in place, resharding as needed); return this rank's dict.

    A run resumed with a different world size gets rank 0's per-rank state (loops, optimizer of
    the dense part); data position and RNG then continue from rank 0's.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(
            f"checkpoint {path} is missing or incomplete (no valid {MARKER}); "
            "use rocmtrain.checkpoint.find_resume(root) to pick a complete one"
        )
    dcp.load(sharded, checkpoint_id=str(path))
    own = path / f"rank_{rank}.pt"
    if not own.exists():
        log.warning("%s has no state for rank %d; using rank 0's", path, rank)
        own = path / "rank_0.pt"
    return torch.load(own, map_location="cpu", weights_only=False)


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(path: Path) -> bool:
    """Marker present and every file it lists present with its recorded size."""
    marker = read_marker(path)
    if not marker or not isinstance(marker.get("files"), dict):
        return False
    for name, size in marker["files"].items():
        f = Path(path) / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    return True


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint folders under ``root`` (complete or not, temp folders excluded), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=lambda p: (p.name, p.stat().st_mtime))


def find_resume(root: Path) -> Path | None:
    """Newest complete checkpoint under ``root``; skips (and logs) partial or corrupt ones."""
    for path in reversed(list_checkpoints(root)):
        if is_complete(path):
            return path
        log.warning("skipping incomplete or corrupt checkpoint %s", path)
    return None


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (and stale temp folders
    and incomplete ones older than the newest complete). Returns what was removed."""
    root = Path(root)
    complete = [p for p in list_checkpoints(root) if is_complete(p)]
    doomed = complete[:-keep_last] if keep_last > 0 else complete
    newest = complete[-1].name if complete else None
    if newest:
        doomed += [p for p in list_checkpoints(root) if not is_complete(p) and p.name < newest]
        doomed += [p for p in root.glob(".*.tmp") if p.name[1:-4] < newest]
    for p in doomed:
        remove(p)
    return doomed


def save(trainer: pl.Trainer, root: Path | None = None, keep_last: int | None = None) -> Path:
    """Collective: checkpoint ``trainer`` now into ``root`` (default: the AtomicCheckpoint
    callback's root) and prune to ``keep_last``. Call on every rank at a step boundary."""
    cb = next((c for c in trainer.callbacks if isinstance(c, AtomicCheckpoint)), None)
    if root is None:
        if cb is None:
            raise ValueError("no root given and no AtomicCheckpoint callback on the trainer")
        root = cb.root
    keep = keep_last if keep_last is not None else (cb.keep_last if cb else 2)
    path = Path(root) / checkpoint_name(trainer.global_step)
    trainer.save_checkpoint(path, weights_only=False)
    if trainer.is_global_zero:
        prune(Path(root), keep)
    trainer.strategy.barrier("rocmtrain.checkpoint.save")
    if cb is not None:
        cb.last_saved = path
    return path


class AtomicCheckpoint(pl.Callback):
    """Write atomic sharded checkpoints every N steps and/or at epoch ends; keep the last N."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        every_n_train_steps: int | None = None,
        every_n_epochs: int = 1,
        keep_last: int = 2,
    ) -> None:
        self.root = Path(root)
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = every_n_epochs
        self.keep_last = keep_last
        self.last_saved: Path | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step > 0 and trainer.global_step % n == 0:
            save(trainer, self.root, self.keep_last)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0:
            if self.last_saved is None or self.last_saved.name != checkpoint_name(
                trainer.global_step
            ):
                save(trainer, self.root, self.keep_last)
