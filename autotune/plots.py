"""Plots of a search, as PNG files in <run_dir>/plots (matplotlib, no display):
throughput per trial with the best so far, throughput by each knob's value, a
parallel-coordinates view, and knob importance (Optuna's default evaluator)."""

from __future__ import annotations

from pathlib import Path

BASELINE_COLOR, BEST_COLOR, FAIL_COLOR = "#444444", "#d62728", "#ff7f0e"


def write_all(result, storage_url: str, study_name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out = result.run_dir / "plots"
    out.mkdir(exist_ok=True)
    knobs = list(result.space.search)
    files = [_per_trial(result, out / "throughput_per_trial.png"),
             _by_knob(result, knobs, out / "throughput_by_knob.png"),
             _parallel(result, knobs, out / "parallel_coordinates.png"),
             _importance(storage_url, study_name, out / "knob_importance.png")]
    return [f for f in files if f is not None]


def _done(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _per_trial(result, path: Path) -> Path:
    import matplotlib.pyplot as plt

    records = sorted(result.records, key=lambda r: r.number)
    ok = [r for r in records if r.throughput]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.scatter([r.number for r in ok], [r.throughput for r in ok], color="#1f77b4", zorder=3, label="trial")
    best, xs, ys = 0.0, [], []
    for r in records:
        best = max(best, r.throughput or 0.0)
        xs.append(r.number)
        ys.append(best if best else float("nan"))
    ax.step(xs, ys, where="post", color=BEST_COLOR, label="best so far")
    if result.baseline and result.baseline.throughput:
        ax.axhline(result.baseline.throughput, color=BASELINE_COLOR, linestyle="--", label="baseline")
    failed = [r for r in records if not r.throughput]
    if failed:
        ax.scatter([r.number for r in failed], [0] * len(failed), marker="x", color=FAIL_COLOR, zorder=3,
                   label="failed (oom / error / timeout)")
    ax.set(xlabel="trial", ylabel="samples/s", title="Throughput per trial", ylim=(0, None))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return _done(fig, path)


def _by_knob(result, knobs: list[str], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    ok = [r for r in result.records if r.throughput]
    if not knobs or not ok:
        return None
    cols = min(3, len(knobs))
    rows = -(-len(knobs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, knob in zip(axes.flat, knobs):
        values = result.space.search[knob]
        for i, value in enumerate(values):
            ys = [r.throughput for r in ok if r.knobs[knob] == value]
            xs = [i + 0.08 * ((j % 5) - 2) for j in range(len(ys))]  # a little spread, deterministic
            ax.scatter(xs, ys, color="#1f77b4", alpha=0.7)
            if ys:
                ax.hlines(sorted(ys)[len(ys) // 2], i - 0.3, i + 0.3, color=BEST_COLOR)
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set(title=knob, ylabel="samples/s", ylim=(0, None))
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(knobs):]:
        ax.axis("off")
    fig.suptitle("Throughput by knob value (line: median)")
    return _done(fig, path)


def _parallel(result, knobs: list[str], path: Path) -> Path | None:
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    ok = sorted((r for r in result.records if r.throughput), key=lambda r: r.throughput)
    if not knobs or len(ok) < 2:
        return None
    lo, hi = ok[0].throughput, ok[-1].throughput
    norm = colors.Normalize(lo, hi if hi > lo else lo + 1)
    axes_names = knobs + ["samples/s"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(axes_names)), 4.5))

    def position(r, name):
        if name == "samples/s":
            return norm(r.throughput)
        values = result.space.search[name]
        return values.index(r.knobs[name]) / max(len(values) - 1, 1)

    for r in ok:
        style = {"color": cm.viridis(norm(r.throughput)), "alpha": 0.8, "linewidth": 1.2}
        if r is result.best:
            style = {"color": BEST_COLOR, "linewidth": 3, "label": f"best (#{r.number})"}
        elif r.is_baseline:
            style = {"color": BASELINE_COLOR, "linewidth": 2.5, "linestyle": "--", "label": "baseline"}
        ax.plot(range(len(axes_names)), [position(r, n) for n in axes_names], **style)
    for i, name in enumerate(axes_names):
        ax.axvline(i, color="black", linewidth=0.8)
        labels = [f"{lo:.0f}", f"{hi:.0f}"] if name == "samples/s" else [str(v) for v in result.space.search[name]]
        for j, label in enumerate(labels):
            ax.text(i + 0.03, j / max(len(labels) - 1, 1), label, fontsize=8, va="center")
    ax.set_xticks(range(len(axes_names)), axes_names)
    ax.set_yticks([])
    ax.set_title("Parallel coordinates (colour: samples/s)")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=ax, label="samples/s")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8, frameon=False)
    return _done(fig, path)


def knob_importance(storage_url: str, study_name: str) -> dict[str, float] | None:
    """Optuna's parameter importances over the completed trials, or None when
    there are too few (or too little variation) to say."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=storage_url)
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError):
        return None


def _importance(storage_url: str, study_name: str, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    importance = knob_importance(storage_url, study_name)
    if not importance:
        return None
    names = list(importance)[::-1]
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(names) + 1.5))
    ax.barh(names, [importance[n] for n in names], color="#1f77b4")
    ax.set(xlabel="importance (share of throughput variation)", title="Knob importance (Optuna)")
    ax.grid(alpha=0.3, axis="x")
    return _done(fig, path)
