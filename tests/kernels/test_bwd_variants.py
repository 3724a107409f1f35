"""scripts/bench/bwd_variants.py on the CPU: the variants agree with each other, and the JSON holds
every round, the ratio against the first variant and the per-case shape the BENCHMARKS tables use;
other copies of the kernel file run as named implementations (``--impl NAME=FILE``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))


def test_bwd_variants_cpu_smoke(tmp_path):
    import bwd_variants

    import rocmtrain.kernels.tbe_backward as tb

    config = tb.backward_config
    # "prev", "old" = other copies of the kernel file, each loaded as its own module (here:
    # this one)
    argv = ["--cpu-smoke", "--dists", "zipf", "--variants", "table,dot16x4,s4_w1,prev,old+s4_w1",
            "--impl", f"prev={tb.__file__}", "--impl", f"old={tb.__file__}",
            "--out", str(tmp_path)]  # fmt: skip
    assert bwd_variants.main(argv) == 0
    impls = bwd_variants._IMPLS
    assert len({id(impls[n]) for n in ("current", "prev", "old")}) == 3  # their own kernels
    assert impls["current"] is tb
    res = json.loads((tmp_path / "bwd_variants.json").read_text())
    assert res["variants"] == ["table", "dot16x4", "s4_w1", "prev", "old+s4_w1"]
    assert all(c["ok"] for c in res["check"].values()), res["check"]
    case = res["cases"]["zipf"]
    assert case["ids"] == 4 * 214  # B x the MLPerf multi-hot sizes
    for name in res["variants"]:
        row = case["variants"][name]
        assert row["ms"]["min"] <= row["ms"]["median"] <= row["ms"]["max"]
        assert row["speedup_vs_table"]["min"] > 0
    assert case["variants"]["table"]["speedup_vs_table"]["median"] == 1.0
    assert tb.backward_config is config  # the arch table's config again for later tests


def test_variant_names_pin_what_they_say():
    """Named variants are one-step configs whatever the table ships; ``s<k>`` names take the
    table's tile but a register cap only when they name one (``_r<n>``)."""
    import bwd_variants

    assert bwd_variants.variant_config("scan8x2_r72") == {**bwd_variants._ONE_STEP, "maxnreg": 72}
    assert bwd_variants.variant_config("s8") == {"steps": 8, "maxnreg": 0}
    assert bwd_variants.variant_config("s4_w4_t16_r64") == {
        "steps": 4, "maxnreg": 64, "num_warps": 4, "step": 16}  # fmt: skip
    for bad in ("s", "s4_x2", "scan8x3"):
        with pytest.raises(KeyError):
            bwd_variants.variant_config(bad)


@pytest.mark.parametrize(
    "impl, says",
    [("prev", "expected NAME=FILE"), ("s4=/x.py", "NAME must be"), ("prev=/nonexistent.py",
     "no such file")],
)  # fmt: skip
def test_bad_impl_says_what_to_give(impl, says, capsys):
    import bwd_variants

    with pytest.raises(SystemExit) as e:
        bwd_variants.main(["--cpu-smoke", "--impl", impl, "--variants", "table"])
    assert says in str(e.value) and impl.partition("=")[0] in str(e.value)


def test_recipe_ids_and_bf16_gradients(tmp_path):
    """``--dists recipe``: the end-to-end recipe's own id sampler (its config's Zipf exponent),
    with bf16 output gradients; every variant agrees with the first."""
    import bwd_variants
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(ROOT / "configs" / "data" / "synthetic.yaml")
    assert bwd_variants.RECIPE_ZIPF == cfg.zipf_exponent
    argv = ["--cpu-smoke", "--dists", "recipe", "--grad-dtype", "bfloat16", "--variants",
            "table,dot16x4", "--out", str(tmp_path)]  # fmt: skip
    assert bwd_variants.main(argv) == 0
    res = json.loads((tmp_path / "bwd_variants.json").read_text())
    assert res["grad_dtype"] == "torch.bfloat16" and all(c["ok"] for c in res["check"].values())
    case = bwd_variants.dlrm_case(1000, 64, "recipe")
    idx, off = bwd_variants.inputs(case, torch.device("cpu"), seed=0)[0]
    assert off[-1] == idx.numel() == 64 * sum(case.hot)
    feat = torch.arange(len(case.rows)).repeat_interleave(torch.tensor(case.hot) * 64)
    assert (idx >= 0).all() and (idx < torch.tensor(case.rows)[feat]).all()
    # Zipf(1.05) with the hottest ids first: id 0 of the 1000-row tables is the most frequent
    big = [f for f, r in enumerate(case.rows) if r == 1000]
    counts = torch.bincount(idx[torch.isin(feat, torch.tensor(big))], minlength=1000)
    assert counts[0] == counts.max() and counts[0] > 20 * counts[500:].float().mean()


@pytest.mark.parametrize("argv, says", [(["--dists", "zipff"], "--dists: unknown ['zipff']")])
def test_bad_dist_says_what_to_use(argv, says):
    import bwd_variants

    with pytest.raises(SystemExit) as e:
        bwd_variants.main(["--cpu-smoke", *argv])
    assert says in str(e.value) and "recipe" in str(e.value)
