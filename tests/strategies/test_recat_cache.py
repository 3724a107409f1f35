"""The cached all-to-all permutation: TorchRec's own values, built once per argument set.

Against TorchRec's ``_get_recat`` itself (the reference) for plain, staggered (TWRW) and
variable-batch-per-rank splits; the GPU test shows the sync it removes: TorchRec's function
synchronises the host (``torch.cuda.set_sync_debug_mode("error")`` raises), the cached one does
not after its first call. The strategy's 2-rank gloo runs (``test_input_pipeline.py``,
``test_strategy_*``) train with the cache installed, where world size 2 uses the permutation.
"""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed import dist_data

from rocmtrain.strategies import recat_cache

CASES = [
    dict(local_split=3, num_splits=2),
    dict(local_split=2, num_splits=4, stagger=2),
    dict(local_split=0, num_splits=4),
    dict(local_split=2, num_splits=3, batch_size_per_rank=[4, 2, 3]),
    dict(local_split=2, num_splits=3, batch_size_per_rank=[4, 4, 4]),
]


@pytest.fixture
def cache():
    recat_cache.uninstall()
    original = dist_data._get_recat
    assert recat_cache.install()
    yield original
    recat_cache.uninstall()
    assert dist_data._get_recat is original


@pytest.mark.parametrize("case", CASES, ids=str)
def test_cached_recat_is_torchrecs_and_built_once(cache, case):
    want = cache(**case, device=torch.device("cpu"))
    first = dist_data._get_recat(**case, device=torch.device("cpu"))
    again = dist_data._get_recat(**case, device="cpu")  # the same device spelled differently
    if want is None:
        assert first is None and again is None
    else:
        assert torch.equal(first, want) and first.dtype == want.dtype
        assert again is first
    assert recat_cache.stats == {"built": 1, "reused": 1}


def test_other_arguments_get_their_own_entry(cache):
    a = dist_data._get_recat(2, 4, 1, torch.device("cpu"))
    b = dist_data._get_recat(2, 4, 2, torch.device("cpu"))
    c = dist_data._get_recat(2, 3, 1, torch.device("cpu"), [4, 2, 3])
    d = dist_data._get_recat(2, 3, 1, torch.device("cpu"), [4, 3, 2])
    assert not torch.equal(a, b) and not torch.equal(c, d)
    assert recat_cache.stats["built"] == 4


def test_cache_is_bounded(cache, monkeypatch):
    monkeypatch.setattr(recat_cache, "MAX_ENTRIES", 3)
    for bs in range(1, 6):
        dist_data._get_recat(1, 2, 1, torch.device("cpu"), [bs, bs + 1])
    assert len(recat_cache._cache) == 3
    dist_data._get_recat(1, 2, 1, torch.device("cpu"), [1, 2])  # dropped: built again
    assert recat_cache.stats["built"] == 6


def test_install_is_idempotent_and_refuses_another_signature(cache, monkeypatch):
    assert recat_cache.install() and dist_data._get_recat is recat_cache.cached_recat
    recat_cache.uninstall()

    def other(local_split, num_splits, device=None):  # a future TorchRec
        return None

    monkeypatch.setattr(dist_data, "_get_recat", other)
    assert not recat_cache.install()
    assert dist_data._get_recat is other


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cached_recat_makes_no_host_sync_on_gpu(cache):
    dev = torch.device("cuda")
    first = dist_data._get_recat(4, 2, 1, dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            cache(4, 2, 1, dev)  # TorchRec's own: a pageable host-to-device copy
        again = dist_data._get_recat(4, 2, 1, dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert again is first and torch.equal(first.cpu(), cache(4, 2, 1, dev).cpu())
