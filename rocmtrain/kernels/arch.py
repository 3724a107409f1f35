"""Per-architecture launch parameters for the TBE kernels, keyed by gfx arch / compute capability.

Triton's ``num_warps`` counts hardware warps: 32 lanes on NVIDIA and RDNA, 64-lane wavefronts on
CDNA (gfx90a MI200, gfx942 MI300). The table therefore fixes *lanes per program* and derives
``num_warps = lanes // warp_size``; a 128-lane program is 4 warps on an H200 and 2 wavefronts on an
MI300X. ``waves_per_eu`` (an occupancy hint of Triton's AMD backend) is passed on AMD only.

Forward tile per program: ``[BAGS, BLOCK_L, BLOCK_D]`` (bags x positions x columns), accumulated in
fp32 registers across the bag's length and reduced over ``BLOCK_L`` once at the end. ``FWD_TILES``
holds one tile policy for one-hot and one for multi-hot features per arch: ~16-32 bytes of
gathered weights per lane per loop step (several 16-byte loads in flight), many bags per program
for L=1.

Usage::

    cfg = forward_config(device_info(0), max_dim=128, avg_len=32.0, elem_bytes=4)
    cfg.launch_kwargs()      # {"num_warps": 4, "num_stages": 2} (+ waves_per_eu on AMD)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rocmtrain.platform import DeviceInfo, normalize_gfx_arch, warp_size_for_arch


@dataclass(frozen=True)
class ArchParams:
    """Launch-parameter policy for one architecture."""

    bwd_lanes: int
    """Lanes per backward tile program (segment reduce + update)."""
    bwd_hot_lanes: int = 128
    """Lanes per hot-row program (one ``[hot_tiles, BLOCK_D]`` block of fp32 partials)."""
    waves_per_eu: int = 0
    """AMD occupancy hint (waves per SIMD); 0 = leave to the compiler. Ignored off AMD."""
    num_stages: int = 2
    """Software-pipelining depth of the loops."""
    bwd_max_tile: int = 16
    """Backward: most sorted positions per program (one ``[tile, BLOCK_D]`` gradient tile); a
    row seen more often than one tile holds is combined from fp32 partials (no serialisation).
    At most 16 on GPUs: Triton 3.6 fails to compile the SGD variant of the tile kernel for
    tiles of 32 or 64 positions at D <= 64 (TritonGPURemoveLayoutConversions: "mask type
    matches ptr type"; the failing cases are recorded in scripts/bench/BENCHMARKS.md)."""
    bwd_elems_per_lane: int = 16
    """Backward: fp32 elements per lane of one ``[tile, BLOCK_D]`` tensor (the tile shrinks for
    wide rows so the gradient tile, its scan and the weight rows stay in registers)."""
    bwd_reduce: str = "scan"
    """Backward: how a tile sums each row's run of equal sorted keys. ``"scan"``: a segmented
    ``tl.associative_scan`` over the ``[tile, BLOCK_D]`` gradient tile (the sum lands at the
    run's last position); ``"dot"``: a ``[tile, tile]`` 0/1 same-key matrix times the gradient
    tile in fp32 (``tl.dot(..., input_precision="ieee")``: every position gets its run's sum)."""
    bwd_bag_sorted: bool = False
    """Backward: gather each sorted position's bag once (``bags[perm]``, one extra pass) so the
    tile kernel reads it in sorted order, one dependent load less before the gradient rows."""
    bwd_steps: int = 1
    """Backward: steps of one ``[tile, BLOCK_D]`` gradient tile each per tile program. A row's
    occurrences inside one program are summed in registers across steps, so only the runs cut
    by a program's borders leave fp32 partials for the hot-row kernels (whose work scales with
    the number of programs). 1 = straight-line code (a loop costs registers)."""
    bwd_piece_steps: int = 1
    """Backward: steps gathered per loop iteration where a tile program is one row's interior
    piece (skewed ids: most programs of a hot row), so ``bwd_piece_steps * step`` gradient rows
    are in flight at once; at most ``bwd_steps``, dividing it. The piece path holds no keys,
    rows or optimizer state, so it has the registers for a wider gather."""
    bwd_maxnreg: int = 0
    """Backward tile kernel: registers per thread at most (NVIDIA's ``maxnreg``; 0 = the
    compiler's choice; ignored on AMD, whose backend has no such option). The tile kernel is
    latency-bound (a chain of dependent loads per tile): fewer registers = more programs resident
    per SM to overlap those chains; too few spill to local memory."""
    hot_block: int = 32
    """Backward: per-block carries added per step when a hot row spans several hot blocks."""
    hot_tiles: int = 16
    """Backward: tiles per hot-row block. A hot row's fp32 tile partials are reduced in two
    levels: every block of ``hot_tiles`` tiles sums its share of the row in parallel (one
    program per block, 2 * hot_tiles partial slots in slot order), and the block where the row
    ends adds the carries of the blocks before it (``hot_block`` at a time). A row seen 1e5
    times at tile 16 spans ~390 blocks: ~390 parallel programs plus a ~13-step carry sum."""


# Rationale (KERNELS.md has more): NVIDIA Hopper/Ampere reach full HBM bandwidth with 4-warp
# programs and many resident CTAs; CDNA wavefronts are 64 wide, so 128 lanes = 2 waves and
# waves_per_eu=2 keeps register use low enough for 8+ waves per CU on gfx942 / gfx90a.
ARCH_TABLE: dict[str, ArchParams] = {
    # sm_90 was tuned at the DLRM table set (scripts/bench/bwd_variants.py; the numbers are in
    # scripts/bench/BENCHMARKS.md, "Records kept from the package docs"). Steps of 8 positions x
    # 64 lanes over 16 x 128; bags read in sorted order (one dependent load less per step). 8
    # steps per program, because the hot-row kernels scale with the number of programs; the loop
    # then takes 104 registers, so it is capped at 80 (more programs per SM for a few spills).
    # Interior pieces gather 2 steps (16 rows) per iteration; 4 per iteration was slower.
    "sm_90": ArchParams(
        bwd_lanes=64,
        bwd_max_tile=8,
        bwd_bag_sorted=True,
        bwd_steps=8,
        bwd_maxnreg=80,
        bwd_piece_steps=2,
    ),
    # sm_80: the H200's tile, without the steps and the register cap (not measured on an A100)
    "sm_80": ArchParams(bwd_lanes=64, bwd_max_tile=8, bwd_bag_sorted=True),
    # CDNA: not measured (no AMD GPU here); 128-lane tiles of 16 = 2 wave64s per program
    "gfx942": ArchParams(bwd_lanes=128, waves_per_eu=2, bwd_bag_sorted=True),
    "gfx950": ArchParams(bwd_lanes=128, waves_per_eu=2, bwd_bag_sorted=True),
    "gfx90a": ArchParams(bwd_lanes=128, waves_per_eu=2, bwd_bag_sorted=True),
    "rdna": ArchParams(bwd_lanes=64, bwd_hot_lanes=64, bwd_bag_sorted=True),
    "nvidia": ArchParams(bwd_lanes=64, bwd_max_tile=8, bwd_bag_sorted=True),
    # TRITON_INTERPRET=1 on CPU: numpy runs a whole tile at once and each program costs ~50 ms of
    # Python, so the interpreter gets few, large programs (backward tiles of up to 512 positions:
    # a row seen 1e4 times still spans ~20 tiles and takes the hot-row path).
    "cpu": ArchParams(
        bwd_lanes=32,
        bwd_hot_lanes=32,
        bwd_reduce="dot",  # numpy matmul; the interpreter's generic scan is a Python loop
        bwd_max_tile=512,
        bwd_elems_per_lane=4096,
        bwd_steps=2,  # every test's backward walks the step loop and carries runs across it
        hot_block=4,  # small, so the tests walk several carry chunks
        hot_tiles=4,
    ),  # fmt: skip
}


@dataclass(frozen=True)
class FwdTile:
    """Forward tile policy of one bag class on one arch (table entries, tuned on the GPU with
    ``bench_tbe.py --autotune``)."""

    lanes: int
    """Lanes per program (num_warps = lanes // warp_size)."""
    bytes_per_lane: int
    """Target bytes of weights gathered per lane per loop step."""
    max_bags: int
    """Most bags per program."""
    max_block_l: int
    """Most positions of one bag per loop step."""
    waves_per_eu: int = 0
    """AMD occupancy hint; 0 = the arch's default. Ignored off AMD."""
    prefetch: bool = False
    """Load the next loop step's indices before this step's row gathers (bags that take
    several steps: one dependent load off each step's indices -> rows chain)."""


# One-hot features (L <= 1.5 on average: 13 of the 26 DLRM-DCNv2 features) need no position loop:
# a tile of many bags x 1 position keeps every lane loading; multi-hot features take wide
# BLOCK_L so a program streams one bag's rows with several 16-byte loads in flight per lane.
# CDNA (wave64): 128 lanes = 2 waves; one-hot programs are short, so 4 waves per EU stay resident.
FWD_TILES: dict[str, dict[str, FwdTile]] = {
    # sm_90 multi-hot from the H200 autotune (kernel time; numbers in scripts/bench/BENCHMARKS.md):
    # 64 lanes, 2 positions x 8 bags per step and the index prefetch beat 128 lanes x 8
    # positions x 1 bag at fp32 D=128 and fp16 D=256, L=32
    "sm_90": {
        "onehot": FwdTile(128, 32, 32, 1),
        "multihot": FwdTile(64, 128, 16, 2, prefetch=True),
    },
    "sm_80": {"onehot": FwdTile(128, 32, 32, 1), "multihot": FwdTile(128, 32, 16, 16)},
    "gfx942": {"onehot": FwdTile(128, 32, 32, 1, 4), "multihot": FwdTile(128, 32, 16, 16, 2)},
    "gfx950": {"onehot": FwdTile(128, 32, 32, 1, 4), "multihot": FwdTile(128, 32, 16, 16, 2)},
    "gfx90a": {"onehot": FwdTile(128, 16, 16, 1, 4), "multihot": FwdTile(128, 16, 16, 16, 2)},
    "rdna": {"onehot": FwdTile(64, 16, 16, 1), "multihot": FwdTile(64, 16, 16, 16)},
    "nvidia": {"onehot": FwdTile(128, 16, 16, 1), "multihot": FwdTile(128, 16, 16, 16)},
    "cpu": {"onehot": FwdTile(32, 2048, 256, 1), "multihot": FwdTile(32, 2048, 256, 64)},
}
# The backward's keys kernel walks the same bags x BLOCK_L grid of positions as the forward but
# writes one key and one bag per position instead of gathering rows, so on sm_90 it keeps the tile
# it had before the forward's changed: the 64-lane, 2-position multi-hot tile made its profiled
# call about twice as slow at the DLRM table set and at L=32 (scripts/bench/BENCHMARKS.md).
KEYS_TILES: dict[str, dict[str, FwdTile]] = {
    **FWD_TILES,
    "sm_90": {"onehot": FwdTile(128, 32, 32, 1), "multihot": FwdTile(128, 32, 16, 16)},
}
ONEHOT_MAX_LEN = 1.5
"""Mean bag length up to which a feature group uses the one-hot tile."""


def arch_key(info: DeviceInfo) -> str:
    """Table key for a device: ``sm_90``/``gfx942`` when listed, else a family default."""
    if info.backend == "cpu":
        return "cpu"
    if info.backend == "rocm":
        arch = normalize_gfx_arch(info.arch) or ""
        if arch in ARCH_TABLE:
            return arch
        return "rdna" if warp_size_for_arch(arch) == 32 else "gfx90a"
    if info.arch in ARCH_TABLE:
        return info.arch
    return "sm_80" if info.arch and info.arch >= "sm_80" else "nvidia"


def _pow2_floor(x: float) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def _pow2_ceil(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


@dataclass(frozen=True)
class LaunchConfig:
    """One kernel launch's tile sizes and options."""

    bags: int
    block_l: int
    block_d: int
    num_warps: int
    num_stages: int
    waves_per_eu: int
    is_amd: bool
    hot_block: int = 0
    hot_tiles: int = 0
    reduce: str = "scan"
    bag_sorted: bool = False
    hot_num_warps: int = 0
    maxnreg: int = 0
    steps: int = 1
    piece_steps: int = 1
    """Backward: steps gathered per loop iteration of an interior-piece tile program."""
    prefetch: bool = False
    """Forward: load the next loop step's indices before this step's row gathers."""

    def hot_launch_kwargs(self) -> dict[str, int]:
        """Launch options of the hot-row kernels (their own lane count)."""
        return {**self.launch_kwargs(), "num_warps": self.hot_num_warps or self.num_warps}

    def tile_launch_kwargs(self, optimizer: str) -> dict[str, int]:
        """Launch options of the backward tile kernel: the register cap where the arch sets one,
        except for Adam (its two fp32 moment rows per position spill under the cap: 60 spill
        instructions at 72 registers, D=128, sm_90 SASS)."""
        kw = self.launch_kwargs()
        if self.maxnreg and not self.is_amd and optimizer != "adam":
            kw["maxnreg"] = self.maxnreg
        return kw

    def launch_kwargs(self) -> dict[str, int]:
        kw = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.is_amd and self.waves_per_eu:
            kw["waves_per_eu"] = self.waves_per_eu
        return kw


def forward_config(
    info: DeviceInfo, *, max_dim: int, avg_len: float, elem_bytes: int, block_l: int | None = None,
    bags: int | None = None, lanes: int | None = None, prefetch: bool | None = None,
    tiles: dict[str, dict[str, FwdTile]] | None = None,
) -> LaunchConfig:  # fmt: skip
    """Forward tile for bags of average length ``avg_len`` over dims up to ``max_dim``: the
    arch's one-hot tile when ``avg_len <= ONEHOT_MAX_LEN``, else its multi-hot tile.

    ``block_l``/``bags``/``lanes``/``prefetch`` override the table (the autotuner's
    candidates); ``tiles`` replaces ``FWD_TILES`` (the keys kernel's ``KEYS_TILES``).
    """
    key = arch_key(info)
    p = ARCH_TABLE[key]
    ft = (tiles or FWD_TILES)[key]["onehot" if avg_len <= ONEHOT_MAX_LEN else "multihot"]
    lanes = lanes or ft.lanes
    block_d = min(_pow2_ceil(max_dim), 512 if elem_bytes <= 2 else 256)
    tile = max(lanes * ft.bytes_per_lane // elem_bytes, block_d)  # elements per loop step
    if block_l is None:
        block_l = max(1, min(_pow2_floor(max(avg_len, 1.0)), tile // block_d, ft.max_block_l))
    if bags is None:
        bags = max(1, min(tile // (block_l * block_d), ft.max_bags))
    ws = max(info.warp_size, 1)
    return LaunchConfig(
        bags=bags,
        block_l=block_l,
        block_d=block_d,
        num_warps=max(1, lanes // ws),
        num_stages=p.num_stages,
        waves_per_eu=ft.waves_per_eu or p.waves_per_eu,
        is_amd=info.backend == "rocm",
        prefetch=ft.prefetch if prefetch is None else prefetch,
    )


def keys_config(info: DeviceInfo, *, avg_len: float) -> LaunchConfig:
    """Tile of the backward's keys kernel (``KEYS_TILES``): bags x ``BLOCK_L`` positions per
    program, one int32 index read per position."""
    return forward_config(info, max_dim=1, avg_len=avg_len, elem_bytes=4, tiles=KEYS_TILES)


def keys_candidates(info: DeviceInfo, *, avg_len: float) -> list[LaunchConfig]:
    """Keys-kernel tiles for the first-call autotuner (first = the table's): the table's lanes,
    ``BLOCK_L`` at half, the table's and twice its value (1 to 16), and 1, 2, 4 or 8 positions
    per lane. The table caps bags per program for the forward's row gathers; the keys kernel
    moves 16 bytes per position, so a one-hot group at the table's 32 bags leaves 3 of 4 lanes
    idle and keeps one load in flight per lane."""
    base = keys_config(info, avg_len=avg_len)
    lanes = base.num_warps * max(info.warp_size, 1)
    out = [base]
    for bl in (base.block_l // 2, base.block_l, base.block_l * 2):
        if not 1 <= bl <= 16:
            continue
        for per_lane in (1, 2, 4, 8):
            bags = max(1, per_lane * lanes // bl)
            cfg = forward_config(info, max_dim=1, avg_len=avg_len, elem_bytes=4, block_l=bl,
                                 bags=bags, lanes=lanes, tiles=KEYS_TILES)  # fmt: skip
            if cfg not in out:
                out.append(cfg)
    return out


def forward_candidates(
    info: DeviceInfo, *, max_dim: int, avg_len: float, elem_bytes: int, wide: bool = False
) -> list[LaunchConfig]:
    """Forward configs around the table's choice for the autotuner (first = the table's).

    ``wide``: a larger sweep (bags, BLOCK_L, lanes, and waves_per_eu on AMD) for
    ``bench_tbe.py --autotune``, whose best entry per case goes into ``FWD_TILES``.
    """
    kw = dict(max_dim=max_dim, avg_len=avg_len, elem_bytes=elem_bytes)
    base = forward_config(info, **kw)
    out = [base]
    lanes0 = FWD_TILES[arch_key(info)]["onehot" if avg_len <= ONEHOT_MAX_LEN else "multihot"].lanes

    def add(cfg):
        if cfg not in out:
            out.append(cfg)

    for lanes_mul, bl_mul in ((2, 1), (1, 2), (2, 2), (1, 0.5)):
        bl = max(1, int(base.block_l * bl_mul))
        add(forward_config(info, **kw, block_l=bl, lanes=lanes0 * lanes_mul))
    # one position per step, a few bags per program: with mixed bag lengths (the DLRM set, 1 to
    # 100 ids per bag) no lane idles on a short bag; on the H200 `bags=4, block_l=1, 64 lanes`
    # beat every BLOCK_L > 1 tile over the whole set (scripts/bench/BENCHMARKS.md, "DLRM scale")
    for bags, lanes in ((4, 64), (8, 128)):
        add(forward_config(info, **kw, block_l=1, bags=bags, lanes=lanes))
    if wide:
        for lanes in (64, 128, 256):  # ~60 configs at L=32, ~20 at L=1 (each one compiles)
            for bl in (1, 2, 4, 8, 16, 32):
                if bl > 2 * max(avg_len, 1.0):
                    continue
                for bags in (1, 2, 4, 8, 16, 32):
                    cfg = forward_config(info, **kw, block_l=bl, bags=bags, lanes=lanes)
                    if cfg.bags * cfg.block_l * cfg.block_d > 64 * lanes:
                        continue  # more than 64 fp32 accumulators per lane: spills
                    add(cfg)
                    if cfg.is_amd:
                        for wpe in (1, 2, 4):
                            add(dataclasses.replace(cfg, waves_per_eu=wpe))
    # each tile with and without the index prefetch where a bag takes two steps or more
    for cfg in list(out):
        if 2 * cfg.block_l <= avg_len:
            add(dataclasses.replace(cfg, prefetch=not cfg.prefetch))
    return out


def backward_config(info: DeviceInfo, *, max_dim: int) -> tuple[LaunchConfig, int]:
    """Backward (segmented reduce + fused update) launch and its step: the sorted positions of
    one ``[step, BLOCK_D]`` gradient tile (a tile program walks ``cfg.steps`` of them).

    A row must be whole in one program (rowwise Adagrad needs the row's sum of squares), so
    ``block_d = next_pow2(max_dim)``; the tile holds ``bwd_lanes * bwd_elems_per_lane`` elements
    (positions x columns), at most ``bwd_max_tile`` positions. ``hot_tiles`` = tiles per
    hot-row block, ``hot_block`` = block carries summed per step by the hot-row kernel.
    """
    p = ARCH_TABLE[arch_key(info)]
    block_d = max(16, _pow2_ceil(max_dim))  # narrower tiles hit the same Triton 3.6 bug
    budget = p.bwd_lanes * p.bwd_elems_per_lane
    # at least 16 positions (8 where the table caps tiles at 8): wide rows take more registers
    tile = max(min(16, p.bwd_max_tile), min(p.bwd_max_tile, _pow2_floor(max(1, budget // block_d))))
    if info.backend == "cpu":  # interpreter: [tile, tile] x [tile, D] per program stays ~1 M
        tile = max(16, min(tile, _pow2_floor((2**20 // block_d) ** 0.5)))

    ws = max(info.warp_size, 1)
    steps = p.bwd_steps if block_d <= 128 else 1
    piece = max(1, min(p.bwd_piece_steps, steps))
    cfg = LaunchConfig(
        bags=1,
        block_l=tile,
        block_d=block_d,
        num_warps=max(1, p.bwd_lanes // ws),
        num_stages=p.num_stages,
        waves_per_eu=p.waves_per_eu,
        is_amd=info.backend == "rocm",
        hot_block=max(1, min(p.hot_block, 2 * p.bwd_hot_lanes * p.bwd_elems_per_lane // block_d)),
        hot_tiles=p.hot_tiles,
        hot_num_warps=max(1, p.bwd_hot_lanes // ws),
        reduce=p.bwd_reduce,
        bag_sorted=p.bwd_bag_sorted,
        # wider rows need their registers (D=256 spills under a 72/80 cap)
        maxnreg=p.bwd_maxnreg if info.backend == "cuda" and block_d <= 128 else 0,
        # wider rows: the loop takes 200+ registers (sm_90 SASS, D=256)
        steps=steps,
        piece_steps=piece if steps % piece == 0 else 1,
    )
    return cfg, tile
