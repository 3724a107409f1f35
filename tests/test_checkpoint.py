"""rocmtrain.checkpoint: atomic write protocol, find_resume skipping partial/corrupt checkpoints
(sizes, and sha256 for same-size corruption), keep-last-N pruning, and a real SIGKILL in the middle of a write (single process, real DCP files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rocmtrain import checkpoint as ckpt


def _write(root: Path, step: int, value: float) -> Path:
    state = {"model": {"w": torch.full((64, 4), value), "b": torch.arange(4.0) + value}}
    return ckpt.write_sharded(
        root / ckpt.checkpoint_name(step),
        sharded=state,
        per_rank={"global_step": step, "epoch": 0, "note": f"s{step}"},
        rank=0,
        world_size=1,
        barrier=lambda: None,
    )


def _read(path: Path) -> tuple[torch.Tensor, dict]:
    state = {"model": {"w": torch.zeros(64, 4), "b": torch.zeros(4)}}
    extras = ckpt.read_sharded(path, sharded=state, rank=0)
    return state["model"]["w"], extras


def test_write_is_complete_and_roundtrips(tmp_path):
    path = _write(tmp_path, 3, 1.5)
    assert path.name == "step-000000003" and ckpt.is_complete(path)
    marker = json.loads((path / ckpt.MARKER).read_text())
    assert marker["global_step"] == 3 and "rank_0.pt" in marker["files"]
    assert not list(tmp_path.glob(".*.tmp"))
    w, extras = _read(path)
    assert torch.equal(w, torch.full((64, 4), 1.5)) and extras["note"] == "s3"


def test_find_resume_skips_partial_and_corrupt(tmp_path):
    _write(tmp_path, 1, 1.0)
    good = _write(tmp_path, 2, 2.0)
    # a write killed before its rename: temp folder, never a candidate
    (tmp_path / ".step-000000009.tmp").mkdir()
    # a folder without completion marker
    no_marker = _write(tmp_path, 3, 3.0)
    (no_marker / ckpt.MARKER).unlink()
    # complete marker but a truncated shard file
    corrupt = _write(tmp_path, 4, 4.0)
    shard = next(corrupt.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    assert not ckpt.is_complete(no_marker) and not ckpt.is_complete(corrupt)
    assert ckpt.find_resume(tmp_path) == good
    assert torch.equal(_read(good)[0], torch.full((64, 4), 2.0))
    assert ckpt.find_resume(tmp_path / "missing") is None


def test_prune_keeps_last_n(tmp_path):
    for step in (1, 2, 3, 4):
        _write(tmp_path, step, float(step))
    removed = ckpt.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["step-000000001", "step-000000002"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000000003", "step-000000004"]


KILLER = textwrap.dedent(
    """
    import os, signal, sys, torch
    from pathlib import Path
    from rocmtrain import checkpoint as ckpt
    root = Path(sys.argv[1]); calls = []
    def barrier():  # 2nd barrier = every rank wrote its files, marker + rename not done yet
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.write_sharded(root / ckpt.checkpoint_name(2),
                       sharded={"model": {"w": torch.full((64, 4), 2.0), "b": torch.zeros(4)}},
                       per_rank={"global_step": 2}, rank=0, world_size=1, barrier=barrier)
    """
)


def test_sigkill_during_write_leaves_previous_loadable(tmp_path):
    prev = _write(tmp_path, 1, 1.0)
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path)], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert (tmp_path / ".step-000000002.tmp").is_dir()  # the killed write's leftovers
    assert not (tmp_path / "step-000000002").exists()
    assert ckpt.find_resume(tmp_path) == prev
    assert torch.equal(_read(prev)[0], torch.full((64, 4), 1.0))
    # the next successful write cleans the stale temp folder when pruning
    _write(tmp_path, 3, 3.0)
    ckpt.prune(tmp_path, keep_last=2)
    assert not (tmp_path / ".step-000000002.tmp").exists()


def _flip_bit(file: Path, offset: int) -> None:
    """A same-size corruption: one bit of one byte flipped in place."""
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x10
    file.write_bytes(bytes(data))


def test_marker_records_sha256_of_every_file(tmp_path):
    path = _write(tmp_path, 1, 1.0)
    marker = json.loads((path / ckpt.MARKER).read_text())
    assert marker["format"] == 2 and marker["checksum"] == "sha256"
    assert sorted(marker["checksums"]) == sorted(marker["files"])
    for name, digest in marker["checksums"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest
    assert ckpt.verify(path) is None


def test_same_size_bit_flip_is_skipped_with_a_warning_naming_the_file(tmp_path, caplog):
    good = _write(tmp_path, 1, 1.0)
    bad = _write(tmp_path, 2, 2.0)
    shard = next(bad.glob("*.distcp"))
    size = shard.stat().st_size
    _flip_bit(shard, size // 2)
    assert shard.stat().st_size == size and ckpt.is_complete(bad)  # sizes cannot tell
    with caplog.at_level(logging.WARNING, logger="rocmtrain.checkpoint"):
        assert ckpt.find_resume(tmp_path) == good
    assert f"skipping checkpoint {bad}" in caplog.text and f"{shard.name} is corrupt" in caplog.text
    with pytest.raises(FileNotFoundError, match=rf"{shard.name} is corrupt"):
        _read(bad)
    assert torch.equal(_read(good)[0], torch.full((64, 4), 1.0))


def test_marker_without_checksums_is_accepted_with_a_warning(tmp_path, caplog):
    old = _write(tmp_path, 1, 1.0)
    marker = json.loads((old / ckpt.MARKER).read_text())
    for key in ("checksum", "checksums"):
        del marker[key]
    marker["format"] = 1  # as written before checksums were recorded
    (old / ckpt.MARKER).write_text(json.dumps(marker))
    with caplog.at_level(logging.WARNING, logger="rocmtrain.checkpoint"):
        assert ckpt.find_resume(tmp_path) == old
    assert "has no checksums" in caplog.text and str(old) in caplog.text
    assert torch.equal(_read(old)[0], torch.full((64, 4), 1.0))


def test_rank_missing_from_the_folder_is_never_marked_complete(tmp_path):
    """Ranks that see different checkpoint folders (each rank of a Hydra sweep picks its own
    run_dir): rank 0 finds only its own part and refuses to mark the checkpoint complete."""
    final = tmp_path / ckpt.checkpoint_name(5)
    with pytest.raises(RuntimeError, match=r"rank_1\.pt of 2 ranks not written here"):
        ckpt.write_sharded(
            final,
            sharded={"model": {"w": torch.ones(4)}},
            per_rank={"global_step": 5},
            rank=0,
            world_size=2,  # rank 1 "wrote" into another folder: nothing of it here
            barrier=lambda: None,
        )
    assert not final.exists() and ckpt.find_resume(tmp_path) is None
    assert not list(tmp_path.iterdir())  # no half-written folder left either


def test_marker_listing_fewer_ranks_than_its_world_size_is_skipped(tmp_path, caplog):
    good = _write(tmp_path, 1, 1.0)
    bad = _write(tmp_path, 2, 2.0)
    marker = json.loads((bad / ckpt.MARKER).read_text())
    (bad / ckpt.MARKER).write_text(json.dumps({**marker, "world_size": 2}))
    with caplog.at_level(logging.WARNING, logger="rocmtrain.checkpoint"):
        assert ckpt.find_resume(tmp_path) == good
    assert "rank_1.pt of its 2 ranks" in caplog.text


def test_reading_into_another_shape_names_the_tensor_and_both_sizes(tmp_path):
    path = _write(tmp_path, 1, 1.0)
    state = {"model": {"w": torch.zeros(32, 4), "b": torch.zeros(4), "new": torch.zeros(2)}}
    with pytest.raises(ckpt.ResumeError) as err:
        ckpt.read_sharded(path, sharded=state, rank=0)
    text = str(err.value)
    assert "w is [64, 4] there, [32, 4] here; new is not in it" in text, text
    assert "checkpoint.resume=never" in text and "\n" not in text
    assert torch.equal(state["model"]["w"], torch.zeros(32, 4))  # nothing loaded


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
import torch
from rocmtrain import checkpoint as ckpt

root = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
try:
    ckpt.write_sharded(
        root / ckpt.checkpoint_name(2),
        sharded={"model": {"w": torch.ones(1024, 1024)}},  # 4 MiB: more than the file may hold
        per_rank={"global_step": 2},
        rank=0,
        world_size=1,
        barrier=lambda: None,
    )
except ckpt.CheckpointWriteError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_write_the_filesystem_refuses_is_one_error_and_leaves_nothing(tmp_path):
    """A real write failure (the file-size limit of the writing process: the filesystem says no
    as on a full disk, EFBIG instead of ENOSPC) inside DCP's save: one line naming the checkpoint
    and the reason, no temp or partial folder, the previous checkpoint still the one resumed."""
    prev = _write(tmp_path, 1, 1.0)
    p = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True
    )
    assert p.returncode == 3, p.stderr[-3000:]
    line = p.stdout.strip()
    assert "\n" not in line and "step-000000002 not written: File too large" in line, line
    assert "checkpoint.dir" in line
    assert sorted(x.name for x in tmp_path.iterdir()) == [prev.name]
    assert ckpt.find_resume(tmp_path) == prev


def test_every_checkpoint_skipped_says_training_starts_from_step_0(tmp_path, caplog):
    from rocmtrain.config.schema import RunConfig
    from rocmtrain.train import resume_path

    bad = _write(tmp_path, 1, 1.0)
    (bad / ckpt.MARKER).unlink()
    cfg = RunConfig(run_dir=str(tmp_path))
    cfg.checkpoint.dir = str(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resume_path(cfg) is None
    assert "(1 skipped): training starts again from step 0" in caplog.text
