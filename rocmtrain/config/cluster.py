"""Cluster schema: run the ranks here (``local``) or submit a Slurm batch job (``slurm``).

Options are named like ``sbatch``'s long options with underscores (``--ntasks-per-node`` →
``cluster.ntasks_per_node``), so a Slurm user can guess them::

    python -m rocmtrain recipe=dlrm_mi300 cluster=slurm cluster.nodes=4 \\
        cluster.partition=mi300x cluster.account=proj42 cluster.time=02:00:00 dry_run=true

``null`` means "do not pass this option" (Slurm's / the site's default applies), except for the
job shape: ``nodes`` defaults to ``trainer.num_nodes`` and ``ntasks_per_node`` to
``trainer.devices`` (one rank per GPU), and the job's command line gets both trainer values set
to what Slurm allocates, so Lightning's ``SLURMEnvironment`` agrees with the allocation.
``cluster.container`` runs every rank inside a pinned image (Apptainer or enroot/pyxis), e.g.
``cluster.container.runtime=apptainer cluster.container.image=/shared/rocmtrain.sif``.
See ``rocmtrain/launch/LAUNCH.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rocmtrain.config import ConfigError, check_choice

KINDS = ("local", "slurm")
RUNTIMES = ("none", "apptainer", "pyxis")
CONTAINER_GPUS = ("auto", "rocm", "nvidia", "none")
#: recipe-name words that mean NVIDIA GPUs (``container.gpu=auto``); every other GPU recipe is
#: taken as AMD Instinct, what rocmtrain targets
NVIDIA_RECIPE_WORDS = ("h100", "h200", "a100", "b200", "gb200", "cuda", "nvidia")


#: sbatch's accepted --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED/INFINITE
def _valid_time(text: str) -> bool:
    """Slurm's time formats, with minutes and seconds below 60 and, after a day count, hours
    below 24 (``25:99:99`` matches the pattern but is no time)."""
    if not _TIME.match(text):
        return False
    if text.lower() in ("unlimited", "infinite"):
        return True
    days, _, clock = text.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        return parts[0] < 24 and all(x < 60 for x in parts[1:])
    return all(x < 60 for x in parts[1:])  # M, M:S, H:M:S: the first is unbounded


_TIME = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
    r"|UNLIMITED|INFINITE|unlimited|infinite)$"
)
#: --signal=[{R|B}:]<sig_num>[@sig_time]
_SIGNAL = re.compile(r"^(?:[RB]{1,2}:)?(?:SIG)?[A-Z0-9]+(?:@\d+)?$")
#: --mem: a number with an optional K/M/G/T suffix (0 = all memory of the node)
_MEM = re.compile(r"^\d+[KMGT]?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: names Lightning treats as "not a Slurm job" (interactive mode): ranks would not be detected
_LIGHTNING_INTERACTIVE_NAMES = ("bash", "interactive")


@dataclass
class ContainerConfig:
    """Run each rank inside a container image (the pinned stack of ``scripts/container/``)."""

    runtime: str = "none"
    """``none`` (ranks run the host's Python), ``apptainer`` (each rank is
    ``apptainer exec [--rocm|--nv] --bind ... <image> python -m rocmtrain ...``) or ``pyxis``
    (``srun --container-image=<image> --container-mounts=...``: enroot through Slurm's pyxis
    plugin)."""
    image: str | None = None
    """The image: for apptainer a ``.sif`` file (``apptainer build rocmtrain.sif
    scripts/container/rocmtrain.def``) or ``docker://...``; for pyxis an enroot image
    reference (``registry#repo:tag``, ``repo:tag``) or a ``.sqsh`` file."""
    mounts: list[str] = field(default_factory=list)
    """Extra host paths visible in the container, ``/data`` or ``/data:/mnt/data[:ro]`` (absolute).
    The job folder (``cluster.chdir``) and the run folder are always mounted at their own path,
    so logs, checkpoints and the requeue flag are where the batch script looks."""
    gpu: str = "auto"
    """GPU flag of ``apptainer exec``: ``rocm`` (``--rocm``), ``nvidia`` (``--nv``), ``none``, or
    ``auto``: none for ``trainer.accelerator=cpu``, ``--nv`` when the recipe name says NVIDIA
    (``h100``, ``h200``, ``a100``, ``b200``, ``cuda``, ...), else ``--rocm``. pyxis needs no flag
    (Slurm's GPU allocation and enroot's hooks give the devices)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the field, the bad value and the fix."""
        check_choice("cluster.container.runtime", self.runtime, RUNTIMES)
        check_choice("cluster.container.gpu", self.gpu, CONTAINER_GPUS)
        self._validate_image()
        for mount in self.mounts:
            self._validate_mount(str(mount))

    def resolved_gpu(self, *, accelerator: str, recipe: str) -> str:
        """``rocm``, ``nvidia`` or ``none``: :attr:`gpu`, with ``auto`` decided as documented."""
        if self.gpu != "auto":
            return self.gpu
        if accelerator == "cpu":
            return "none"
        name = recipe.lower()
        return "nvidia" if any(w in name for w in NVIDIA_RECIPE_WORDS) else "rocm"

    def _validate_image(self) -> None:
        image = self.image
        if self.runtime == "none":
            if image:
                raise ConfigError(
                    "cluster.container.image",
                    image,
                    "an image needs a runtime: set cluster.container.runtime=apptainer or pyxis "
                    "(or drop the image)",
                )
            return
        if image is None or not str(image).strip():
            raise ConfigError(
                "cluster.container.image",
                image,
                f"runtime={self.runtime} needs an image: a .sif file built from "
                "scripts/container/rocmtrain.def, or a registry image like rocm/pytorch:<tag>",
            )
        if any(c in str(image) for c in "\n\r\0"):
            raise ConfigError("cluster.container.image", image, "remove the newline/NUL")
        if self.runtime == "pyxis" and "," in str(image):
            raise ConfigError(
                "cluster.container.image", image, "pyxis cannot take a ',' in the image name"
            )

    def _validate_mount(self, mount: str) -> None:
        parts = mount.split(":")
        fix = "give an absolute host path, /data or /data:/mnt/data[:ro]"
        if not mount or any(c in mount for c in "\n\r\0") or len(parts) > 3:
            raise ConfigError("cluster.container.mounts", mount, fix)
        if not all(p.startswith("/") for p in parts[:2]):
            raise ConfigError("cluster.container.mounts", mount, fix)
        if self.runtime == "pyxis" and "," in mount:
            raise ConfigError(
                "cluster.container.mounts",
                mount,
                "pyxis separates mounts with ',': use a path without one",
            )


@dataclass
class ClusterConfig:
    """Where ranks run: ``local`` (Lightning spawns them here) or ``slurm`` (a batch job)."""

    kind: str = "local"
    """``local`` (train in this process tree) or ``slurm`` (render a batch script and submit it
    with ``sbatch``; each Slurm task re-enters ``python -m rocmtrain`` as one rank)."""

    # --- sbatch options (null = not passed) -------------------------------------------------
    partition: str | None = None
    """``--partition``: the Slurm partition (queue), e.g. ``mi300x``."""
    account: str | None = None
    """``--account``: the account (project) charged for the job."""
    qos: str | None = None
    """``--qos``: quality of service."""
    time: str | None = None
    """``--time``: wall-clock limit (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``, ...)."""
    nodes: int | None = None
    """``--nodes``; null = ``trainer.num_nodes``."""
    ntasks_per_node: int | None = None
    """``--ntasks-per-node``: ranks per node; null = ``trainer.devices`` (one rank per GPU/GCD)."""
    gpus_per_node: int | None = None
    """``--gpus-per-node``; null = ``trainer.devices`` when ``trainer.accelerator=gpu``, else not
    requested. Set 0 on clusters that hand out whole GPU nodes without GRES."""
    cpus_per_task: int | None = None
    """``--cpus-per-task``: CPU cores per rank (data loading threads); also exported as
    ``OMP_NUM_THREADS`` unless ``env`` sets it."""
    mem: str | None = None
    """``--mem``: memory per node (``480G``; ``0`` = all of it)."""
    constraint: str | None = None
    """``--constraint``: node features, e.g. ``mi300x``."""
    exclusive: bool = False
    """``--exclusive``: do not share the nodes with other jobs."""
    requeue: bool = True
    """``--requeue`` (else ``--no-requeue``): allow the batch script (and Slurm on preemption) to
    requeue the job; the requeued job resumes from the last checkpoint."""
    signal: str | None = "B:USR1@300"
    """``--signal``: warn the job this many seconds before the time limit. ``B:`` signals the batch
    shell, which forwards it to every rank; ranks checkpoint and exit 75, and the job is requeued.
    ``TERM@N`` (no ``B:``) signals the ranks directly, which works the same way. null = no warning
    (the job is killed at the limit; a resubmission resumes from an older checkpoint)."""
    job_name: str | None = None
    """``--job-name``; null = ``rocmtrain-<recipe>``. Also names the run folder."""
    output: str | None = None
    """``--output`` (stdout of the job and all ranks; Slurm's ``%j``/``%x`` patterns work);
    null = ``<run_root>/<job name>-%j.out``. Its folder is created at submission."""
    error: str | None = None
    """``--error``; null = merged into ``output``."""
    chdir: str | None = None
    """``--chdir``: working directory of the job; null = the directory you submit from."""
    sbatch_args: list[str] = field(default_factory=list)
    """Extra sbatch options, one per item, e.g. ``[--reservation=demo, --mail-type=END]``."""

    # --- inside the job ---------------------------------------------------------------------
    srun_args: list[str] = field(default_factory=list)
    """Extra srun options, e.g. ``[--mpi=none, --label]`` (containers: see ``container``)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before srun, verbatim (``module load rocm/6.3``, ``source venv/bin/activate``).
    They are your shell code: the only part of the script that is not quoted."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables exported in the batch script (values are quoted); these win over the RCCL plan."""
    export_rccl: bool = True
    """Also export what the recipe's ``rccl`` config sets (``rocmtrain.comms.rccl.plan_rccl_env``),
    so the script shows it; each rank applies (and logs) the same config again before the PG."""
    python: str | None = None
    """Python that runs the ranks; null = the interpreter you submit with (same venv), or
    ``python`` (the image's, first on its PATH) when ranks run in ``container``."""
    run_root: str = "runs"
    """Parent of the per-job run folders: ``run_dir=<run_root>/<job name>-<SLURM_JOB_ID>``, stable
    across a requeue (so the requeued job resumes). An explicit ``run_dir=`` override wins."""
    kill_on_bad_exit: bool = True
    """``srun --kill-on-bad-exit``: when one rank fails, kill the others instead of letting them
    hang in a collective until a timeout."""
    max_restarts: int = 3
    """Requeue at most this many times (``SLURM_RESTART_COUNT``); then the job fails with 75."""
    precheck: bool = True
    """Run ``sbatch --test-only`` first: a job that can never start (more nodes, CPUs or memory
    than the partition has) fails at once with Slurm's reason instead of pending forever."""
    submit_command: str = "sbatch"
    """The submit tool (path or name of ``sbatch``)."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    """Run each rank in a container image (Apptainer or pyxis); default: no container."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the field, the bad value and the fix."""
        check_choice("cluster.kind", self.kind, KINDS)
        for name in ("nodes", "ntasks_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"cluster.{name}", value, "use a positive integer or null")
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise ConfigError("cluster.gpus_per_node", self.gpus_per_node, "use >= 0 or null")
        if self.max_restarts < 0:
            raise ConfigError("cluster.max_restarts", self.max_restarts, "use >= 0")
        if self.time is not None and not _valid_time(str(self.time)):
            raise ConfigError(
                "cluster.time", self.time, "use Slurm's format: MM, HH:MM:SS or D-HH:MM:SS"
            )
        if self.signal is not None and not _SIGNAL.match(str(self.signal)):
            raise ConfigError(
                "cluster.signal", self.signal, "use [B:]SIGNAL[@SECONDS], e.g. B:USR1@300"
            )
        batch_sig = re.match(r"^[RB]*B[RB]*:(?:SIG)?(\w+)", self.signal or "")
        if batch_sig and batch_sig.group(1) not in ("USR1", "USR2"):
            raise ConfigError(
                "cluster.signal",
                self.signal,
                "the batch shell forwards only USR1/USR2 to the ranks (SIGTERM there means 'Slurm "
                "is ending the job': no requeue); use B:USR1@300, or TERM@300 without B: (sent "
                "to the ranks directly)",
            )
        if self.mem is not None and not _MEM.match(str(self.mem)):
            raise ConfigError("cluster.mem", self.mem, "use a size like 480G, 64000M or 0")
        if self.job_name is not None:
            if not self.job_name.strip():
                raise ConfigError("cluster.job_name", self.job_name, "give a non-empty name")
            if self.job_name in _LIGHTNING_INTERACTIVE_NAMES:
                raise ConfigError(
                    "cluster.job_name",
                    self.job_name,
                    "Lightning treats jobs named bash/interactive as not-Slurm; pick another name",
                )
        for name, value in self.env.items():
            if not _ENV_NAME.match(str(name)):
                raise ConfigError(
                    "cluster.env", name, "variable names are letters, digits and _ (not first)"
                )
            if value is None:
                raise ConfigError(f"cluster.env.{name}", value, "give a string value")
        self.container.validate()
