"""The end-of-run monitor figure: step time per step, and memory over time (matplotlib, Agg)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rocmtrain.diagnostics.device_sampler import Sample


def plot_monitor(
    path: Path,
    *,
    step_seconds: list[float],
    samples: list[Sample],
    host_rss: list[tuple[float, int]],
    t0: float,
    headroom_fraction: float,
    stats: dict[str, float] | None = None,
) -> Path:
    """Write a two-panel PNG; HBM used per GPU when sampled, else host RSS of this process."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global backend, safe in any process

    fig = Figure(figsize=(8, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1)
    ax1.plot(range(1, len(step_seconds) + 1), [1e3 * s for s in step_seconds], lw=1)
    for key, style in (("step_time_p50_ms", ":"), ("step_time_p99_ms", "--")):
        if stats and key in stats:
            label = f"{key.split('_')[2]} {stats[key]:.2f} ms"
            ax1.axhline(stats[key], ls=style, c="k", lw=1, label=label)
    if stats:
        ax1.legend(fontsize=7)
    ax1.set_xlabel("step")
    ax1.set_ylabel("step time (ms)")
    ax1.set_title("step time")
    ax1.grid(alpha=0.3)
    per_dev: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.mem_used_bytes is not None:
            per_dev[s.index].append(s)
    if per_dev:
        for i, ss in sorted(per_dev.items()):
            ax2.plot(
                [s.t - t0 for s in ss], [s.mem_used_bytes / 2**30 for s in ss], label=f"GPU {i}"
            )
        total = max((s.mem_total_bytes or 0) for ss in per_dev.values() for s in ss)
        if total:
            ax2.axhline(
                (1 - headroom_fraction) * total / 2**30,
                ls="--",
                c="r",
                lw=1,
                label="headroom limit",
            )
        ax2.set_ylabel("HBM used (GiB)")
        ax2.legend(fontsize=7)
    elif host_rss:
        ax2.plot([t for t, _ in host_rss], [b / 2**30 for _, b in host_rss])
        ax2.set_ylabel("host RSS (GiB)")
    ax2.set_xlabel("time since fit start (s)")
    ax2.set_title("memory")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
