"""``python -m rocmtrain`` as users run it (real subprocesses): every recipe composes and
dry-runs, ``--cfg job`` prints the composed config, and bad input gives one clear error line
naming the field and the fix, exit code 2 and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


def run_cli(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_many([list(args)], cwd=cwd, timeout=timeout)[0]


def run_many(
    arg_lists: list[list[str]], *, cwd: Path, timeout: int = 300
) -> list[subprocess.CompletedProcess]:
    """Run several ``python -m rocmtrain`` commands at once (each is mostly import time)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [
        (
            args,
            subprocess.Popen(
                [sys.executable, "-m", "rocmtrain", *args],
                cwd=cwd,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        )
        for args in arg_lists
    ]
    done = []
    for args, proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


def compose(recipe: str, *overrides: str):
    """Compose in-process with Hydra's compose API (what the CLI composes), as a RunConfig."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rocmtrain.config.schema import configs_dir, register_configs, to_run_config

    register_configs()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
        cfg = hydra_compose("rocmtrain", overrides=[f"recipe={recipe}", "run_dir=r", *overrides])
    return to_run_config(cfg)


def test_recipes_exist():
    assert {"dlrm_cpu", "dlrm_mi250", "dlrm_mi300", "dlrm_dcnv2_h200"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_typed_and_valid(recipe):
    from rocmtrain.config.schema import RunConfig, validate_run_config

    cfg = compose(recipe)
    assert isinstance(cfg, RunConfig) and cfg.recipe == recipe
    validate_run_config(cfg)
    text = (REPO / "recipes" / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_")
    for group in ("model", "data", "strategy", "precision", "rccl", "cluster"):
        assert f"override /{group}:" in text, f"{recipe} has no {group} section"


def test_recipe_specifics():
    cpu = compose("dlrm_cpu")
    assert (cpu.trainer.accelerator, cpu.world_size, cpu.strategy.sharding_type) == (
        "cpu",
        2,
        "table_wise",
    )
    assert cpu.kernel == "fbgemm"
    mi250, mi300 = compose("dlrm_mi250"), compose("dlrm_mi300")
    assert mi250.trainer.devices == 8 and mi300.trainer.devices == 8
    assert mi300.precision.mode == "bf16-mixed" and mi250.precision.mode == "32"
    h200 = compose("dlrm_dcnv2_h200")
    m = h200.model
    assert m.interaction == "dcn" and m.dcn_num_layers == 3 and m.dcn_low_rank_dim == 512
    assert m.embedding_dim == 128 and m.num_features == 26
    assert m.multi_hot_sizes == [
        3,
        2,
        1,
        2,
        6,
        1,
        1,
        1,
        1,
        7,
        3,
        8,
        1,
        6,
        9,
        5,
        1,
        1,
        1,
        12,
        100,
        27,
        10,
        3,
        1,
        1,
    ]
    assert m.dense_arch_layer_sizes == [512, 256, 128]
    assert m.over_arch_layer_sizes == [1024, 1024, 512, 256, 1]
    assert h200.data.batch_size * h200.world_size == 65536
    two = compose("dlrm_dcnv2_h200", "trainer.devices=2")
    assert two.data.batch_size == 32768  # global batch stays 65536


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every CLI subprocess of this module, started at once (each is mostly import time, so
    running them concurrently uses both cores): the dry runs, ``--cfg job``, the bad inputs."""
    tmp = tmp_path_factory.mktemp("cli")
    jobs = {f"dry:{r}": [f"recipe={r}", "dry_run=true", f"run_dir={tmp}/{r}"] for r in DRY}
    jobs["cfg_job"] = ["recipe=dlrm_mi250", "--cfg", "job"]
    jobs |= {
        f"bad:{c}": [*args]
        if any(a.startswith("run_dir=") for a in args)
        else [*args, f"run_dir={tmp}/{c}"]
        for c, (args, _) in BAD.items()
    }
    runs = run_many(list(jobs.values()), cwd=tmp)
    return {"tmp": tmp, **dict(zip(jobs, runs, strict=True))}


DRY = ["dlrm_cpu", "dlrm_mi300"]  # the two dry runs the issue names, as a user types them


def check_dry_run(recipe: str, out: str) -> None:
    cfg = compose(recipe)
    assert f"rocmtrain dry run: recipe {recipe}" in out
    assert f"world size      {cfg.world_size} =" in out
    plan = [line.split() for line in out.splitlines() if line.strip().startswith("t_cat_")]
    assert sorted(row[0] for row in plan) == sorted(
        f"t_cat_{i}" for i in range(cfg.model.num_features)
    )
    for row in plan:
        ranks = [int(r) for r in row[4].strip("[]").split(",")]
        assert all(0 <= r < cfg.world_size for r in ranks)
        if cfg.strategy.sharding_type != "auto":
            assert row[1] == cfg.strategy.sharding_type
    assert "environment" in out and "TORCH_NCCL_ASYNC_ERROR_HANDLING=3" in out
    assert f"python -m rocmtrain recipe={recipe}" in out


@pytest.mark.slow
@pytest.mark.parametrize("recipe", DRY)
def test_dry_run_subprocess(recipe, cli_runs):
    p, tmp = cli_runs[f"dry:{recipe}"], cli_runs["tmp"]
    assert p.returncode == 0, p.stderr[-3000:]
    check_dry_run(recipe, p.stdout)
    assert not (tmp / recipe).exists()  # nothing trained, nothing left behind
    if recipe == "dlrm_cpu":  # table-wise over both ranks
        rows = [ln.split() for ln in p.stdout.splitlines() if ln.strip().startswith("t_cat_")]
        assert {row[4] for row in rows} == {"[0]", "[1]"}


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r not in ("dlrm_cpu", "dlrm_mi300")])
def test_every_recipe_dry_runs(recipe, capsys):
    """The other recipes' plans in-process (the CLI's own print_plan; cpu and mi300 run as
    subprocesses above)."""
    from rocmtrain.dry_run import print_plan

    print_plan(compose(recipe), [f"recipe={recipe}"])
    check_dry_run(recipe, capsys.readouterr().out)


@pytest.mark.slow
def test_cfg_job_prints_composed_config(cli_runs):
    p = cli_runs["cfg_job"]
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = yaml.safe_load(p.stdout)
    assert cfg["recipe"] == "dlrm_mi250" and cfg["trainer"]["devices"] == 8
    assert cfg["model"]["embedding_dim"] == 128 and "rccl" in cfg and "cluster" in cfg


BAD = {
    "unknown_recipe": (["recipe=dlrm_nope"], ["recipe", "dlrm_nope", "dlrm_cpu"]),
    "misspelled_key": (["model.embeding_dim=8"], ["embeding_dim", "--cfg job"]),
    "wrong_type": (["trainer.devices=two"], ["trainer.devices", "two"]),
    "bad_value": (
        ["strategy.sharding_type=diagonal", "dry_run=true"],
        ["strategy.sharding_type='diagonal'", "choose one of", "row_wise"],
    ),
    "plan_does_not_fit": (
        ["dry_run=true", "strategy.ddr_cap_gb=0.00001"],
        ["world size 2", "cannot hold the sharding plan", "trainer.devices", "max_rows_per_table"],
    ),
    "missing_data_file": (
        ["data=criteo_tsv", "data.path=/nonexistent/day_0.tsv"],
        ["data.path", "/nonexistent/day_0.tsv", "data=synthetic"],
    ),
    "gpu_recipe_without_gpu": (
        ["recipe=dlrm_mi300"],
        ["dlrm_mi300", "needs 8 GPU(s)", "python -m rocmtrain recipe=dlrm_cpu"],
    ),
    # Hydra's "+key" adds a key the typed schema does not have: rejected like a misspelled key
    "unknown_plus_key": (["+trainer.max_epoch=1"], ["trainer.max_epoch", "trainer.max_epochs"]),
    # the README's row-wise example on CPU: TorchRec's FBGEMM sharder has no CPU row-wise
    "row_wise_on_cpu": (
        ["trainer.max_epochs=1", "data.batch_size=128", "strategy.sharding_type=row_wise"],
        ["strategy.sharding_type=row_wise", "on cpu", "kernel=torch"],
    ),
    "unwritable_run_dir": (
        ["run_dir=/proc/rocmtrain/x"],
        ["run_dir='/proc/rocmtrain/x'", "writable"],
    ),
    # an empty run_dir would put the logs into the current folder and the checkpoints into
    # /checkpoints (run_dir + "/checkpoints"), where the next such run would resume from
    "empty_run_dir": (["run_dir="], ["run_dir=''", "run_dir=runs/my_run"]),
    # every rank re-runs the command line, so each would run the whole sweep on its own
    "multirun_with_ranks": (
        ["-m", "trainer.max_epochs=1", "seed=1,2"],
        ["-m (Hydra multirun) with 2 ranks", "trainer.devices=1"],
    ),
    "cpu_ranks_beyond_the_machine": (
        ["trainer.devices=100000", "dry_run=true"],
        ["trainer.devices=100000", "core(s); use at most"],
    ),
    # rocmtrain's kernels have no full Adagrad (dlrm_small's default, fine with fbgemm)
    "kernel_optimizer_unsupported": (
        ["kernel=torch"],
        ["model.embedding_optimizer='adagrad'", "rowwise_adagrad", "kernel=fbgemm"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_error(case, cli_runs):
    p = cli_runs[f"bad:{case}"]
    text = p.stdout + p.stderr
    assert p.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    for needle in BAD[case][1]:
        assert needle in text, (needle, text[-3000:])
    assert not (cli_runs["tmp"] / case).exists()  # a rejected command leaves no run dir


@pytest.mark.slow
def test_empty_run_dir_writes_nothing_into_the_current_folder(cli_runs):
    assert cli_runs["bad:empty_run_dir"].returncode == 2
    tmp = cli_runs["tmp"]  # the current folder of every command (gone when they left it empty)
    left = {p.name for p in tmp.iterdir()} if tmp.exists() else set()
    assert not {".hydra", "logs", "checkpoints"} & left, left


@pytest.mark.slow
def test_kernel_optimizer_error_is_one_line(cli_runs):
    p = cli_runs["bad:kernel_optimizer_unsupported"]
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, p.stderr[-3000:]
    assert all(n in errors[0] for n in BAD["kernel_optimizer_unsupported"][1]), errors


VALUE_ERRORS = {
    # override -> (field named in the message, a word of the fix)
    "kernel=torch": ("model.embedding_optimizer='adagrad'", "rowwise_adagrad"),
    "model.dense_arch_layer_sizes=[64,8]": ("model.dense_arch_layer_sizes", "embedding_dim=16"),
    "model.multi_hot_sizes=[1,2]": ("model.multi_hot_sizes", "one size per feature (8)"),
    "+strategy.per_table_sharding.t_cat_99=row_wise": ("strategy.per_table_sharding", "t_cat_7"),
    "checkpoint.keep_last=0": ("checkpoint.keep_last=0", "keep at least 1"),
    "trainer.accelerator=tpu": ("trainer.accelerator='tpu'", "cpu, gpu, auto"),
}


@pytest.mark.parametrize("override", sorted(VALUE_ERRORS))
def test_bad_values_fail_validation_naming_field_and_fix(override):
    from rocmtrain.config import ConfigError
    from rocmtrain.config.schema import validate_run_config

    field, fix = VALUE_ERRORS[override]
    with pytest.raises(ConfigError) as err:
        validate_run_config(compose("dlrm_cpu", override))
    assert field in str(err.value) and fix in str(err.value), str(err.value)


def test_dry_run_runs_the_environment_checks_of_a_real_run(monkeypatch, capsys):
    """The dry run rejects the values a real run rejects and shows the same warnings."""
    from rocmtrain.config import ConfigError
    from rocmtrain.dry_run import print_plan

    monkeypatch.setenv("RCCL_PROTO", "LL")
    print_plan(compose("dlrm_cpu"), [])
    warned = [ln for ln in capsys.readouterr().out.splitlines() if "RCCL_PROTO" in ln]
    assert warned and "NCCL_PROTO" in warned[0], warned
    monkeypatch.setenv("NCCL_PROTO", "LL9")
    with pytest.raises(ConfigError, match="NCCL_PROTO='LL9'"):
        print_plan(compose("dlrm_cpu"), [])


def test_every_group_option_composes():
    """Each file of every configs/ group composes into the typed schema and validates."""
    from rocmtrain.config.schema import validate_run_config

    for group_dir in sorted(p for p in (REPO / "configs").iterdir() if p.is_dir()):
        for option in sorted(group_dir.glob("*.yaml")):
            overrides = [f"{group_dir.name}={option.stem}"]
            if group_dir.name == "data" and option.stem != "synthetic":
                overrides.append("data.path=/data/criteo")  # a path is all those options need
            if group_dir.name == "cluster" and option.stem.endswith("apptainer"):
                overrides.append("cluster.container.image=/shared/rocmtrain.sif")  # its ???
            cfg = compose("dlrm_cpu", *overrides)
            validate_run_config(cfg)


def test_unknown_keys_in_a_typed_group_are_rejected():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rocmtrain.cli import reject_unknown_keys
    from rocmtrain.config import ConfigError
    from rocmtrain.config.schema import configs_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
        ok = hydra_compose("rocmtrain", overrides=["+strategy.per_table_sharding.t_cat_0=row_wise"])
        bad = hydra_compose("rocmtrain", overrides=["+precision.atomics=fp32"])
    reject_unknown_keys(ok)  # a dict field takes new keys
    with pytest.raises(ConfigError, match="precision.atomics"):
        reject_unknown_keys(bad)


def test_a_python_without_the_stack_gets_one_line_saying_activate_the_venv(tmp_path):
    """``python -m rocmtrain`` from a Python that lacks the training stack (-S: no
    site-packages, as a system Python without the activated .venv): one line, no traceback."""
    p = subprocess.run(
        [sys.executable, "-S", "-m", "rocmtrain", "dry_run=true"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "activate the environment (. .venv/bin/activate" in errors[0]
