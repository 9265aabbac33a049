"""Plots of a search, as PNG files in <run_dir>/plots (matplotlib, no display):
throughput per trial with the best so far, throughput by each knob's value, a
parallel-coordinates view, and knob importance (Optuna's fANOVA evaluator).

Pruned trials are their own outcome: drawn at the throughput measured over
their shortened window, with their own marker; failed ones (oom, error,
timeout) have no throughput and are marked at 0."""

from __future__ import annotations

from pathlib import Path

BASELINE_COLOR, BEST_COLOR, FAIL_COLOR, PRUNED_COLOR = "#444444", "#d62728", "#ff7f0e", "#9467bd"
TRIAL_COLOR = "#1f77b4"
PRUNED_LABEL = "pruned (stopped early, measured)"


def write_all(result, storage_url: str, study_name: str) -> list[Path]:
    """The plots, in run_dir/plots; each knob's importance, computed once for its
    figure and the summary, is left in `result.importance`."""
    import matplotlib

    matplotlib.use("Agg")
    out = result.run_dir / "plots"
    out.mkdir(exist_ok=True)
    knobs = list(result.space.search)
    files = [
        _per_trial(result, out / "throughput_per_trial.png"),
        _by_knob(result, knobs, out / "throughput_by_knob.png"),
        _parallel(result, knobs, out / "parallel_coordinates.png"),
        _importance(result, storage_url, study_name, out / "knob_importance.png"),
    ]
    return [f for f in files if f is not None]


def _done(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _per_trial(result, path: Path) -> Path:
    return _done(per_trial_figure(result), path)


def per_trial_figure(result):
    """Throughput per trial: complete trials, pruned ones at their measured
    throughput, failed ones at 0, the best so far and the baseline; the legend
    sits below the axes, where it hides no point."""
    import matplotlib.pyplot as plt

    records = sorted(result.records, key=lambda r: r.number)
    ok = [r for r in records if r.throughput]
    pruned = [r for r in records if r.status == "pruned" and r.measured]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.scatter([r.number for r in ok], [r.throughput for r in ok], color=TRIAL_COLOR, zorder=3, label="trial")
    if pruned:
        ax.scatter(
            [r.number for r in pruned],
            [r.measured for r in pruned],
            marker="v",
            color=PRUNED_COLOR,
            zorder=3,
            label=PRUNED_LABEL,
        )
    best, xs, ys = 0.0, [], []
    for r in records:
        best = max(best, r.throughput or 0.0)
        xs.append(r.number)
        ys.append(best if best else float("nan"))
    ax.step(xs, ys, where="post", color=BEST_COLOR, label="best so far")
    if result.baseline and result.baseline.throughput:
        ax.axhline(result.baseline.throughput, color=BASELINE_COLOR, linestyle="--", label="baseline")
    failed = [r for r in records if r.measured is None]
    if failed:
        ax.scatter(
            [r.number for r in failed],
            [0] * len(failed),
            marker="x",
            color=FAIL_COLOR,
            zorder=3,
            label="failed (oom / error / timeout)",
            clip_on=False,
        )
    ax.set(xlabel="trial", ylabel=result.unit.label, title="Throughput per trial", ylim=(0, None))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def _by_knob(result, knobs: list[str], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    ok = [r for r in result.records if r.measured]  # pruned ones too, at their measured throughput
    if not knobs or not ok:
        return None
    cols = min(3, len(knobs))
    rows = -(-len(knobs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, knob in zip(axes.flat, knobs):
        values = result.space.search[knob]
        for i, value in enumerate(values):
            group = [r for r in ok if r.knobs[knob] == value]
            ys = [r.measured for r in group]
            xs = [i + 0.08 * ((j % 5) - 2) for j in range(len(ys))]  # a little spread, deterministic
            ax.scatter(
                xs, ys, c=[PRUNED_COLOR if r.status == "pruned" else TRIAL_COLOR for r in group], alpha=0.7, marker="o"
            )
            if ys:
                ax.hlines(sorted(ys)[len(ys) // 2], i - 0.3, i + 0.3, color=BEST_COLOR)
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set(title=knob, ylabel=result.unit.label, ylim=(0, None))
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(knobs) :]:
        ax.axis("off")
    fig.suptitle("Throughput by knob value (line: median; purple: pruned, measured over a shortened window)")
    return _done(fig, path)


def _parallel(result, knobs: list[str], path: Path) -> Path | None:
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    ok = sorted((r for r in result.records if r.measured), key=lambda r: r.measured)
    if not knobs or len(ok) < 2:
        return None
    lo, hi = ok[0].measured, ok[-1].measured
    norm = colors.Normalize(lo, hi if hi > lo else lo + 1)
    rate = result.unit.label  # the search's unit (trial.result.unit_of): a language model's tokens/s
    axes_names = knobs + [rate]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(axes_names)), 4.5))

    def position(r, name):
        if name == rate:
            return norm(r.measured)
        values = result.space.search[name]
        return values.index(r.knobs[name]) / max(len(values) - 1, 1)

    for r in ok:
        style = {"color": cm.viridis(norm(r.measured)), "alpha": 0.8, "linewidth": 1.2}
        if r.status == "pruned":
            style.update(linestyle=":")
        if r is result.best:
            style = {"color": BEST_COLOR, "linewidth": 3, "label": f"best (#{r.number})"}
        elif r.is_baseline:
            style = {"color": BASELINE_COLOR, "linewidth": 2.5, "linestyle": "--", "label": "baseline"}
        ax.plot(range(len(axes_names)), [position(r, n) for n in axes_names], **style)
    for i, name in enumerate(axes_names):
        ax.axvline(i, color="black", linewidth=0.8)
        labels = [f"{lo:.0f}", f"{hi:.0f}"] if name == rate else [str(v) for v in result.space.search[name]]
        for j, label in enumerate(labels):
            ax.text(i + 0.03, j / max(len(labels) - 1, 1), label, fontsize=8, va="center")
    ax.set_xticks(range(len(axes_names)), axes_names)
    ax.set_yticks([])
    ax.set_title(f"Parallel coordinates (colour: {rate}; dotted: pruned)")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=ax, label=rate)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8, frameon=False)
    return _done(fig, path)


# fewer completed trials: no importance. A forest fitted to a handful of points, most of them one knob away from the
# baseline, splits the variation by chance; and loading fANOVA (scikit-learn) took ~2 s of every small search here
IMPORTANCE_MIN_TRIALS = 6


def knob_importance(storage_url: str, study_name: str) -> dict[str, float] | None:
    """Each knob's share of the throughput variation (Optuna's fANOVA, seeded) over the completed trials, pruned
    ones included (told to Optuna with their measured throughput); None when there are too few
    (IMPORTANCE_MIN_TRIALS, or too little variation) to say. Optuna's default (PedANOVA) answers another question
    (what sets the top 10% apart) and gave a knob that made trials 7-9x slower 0.00."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=storage_url)
        if len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))) < IMPORTANCE_MIN_TRIALS:
            return None
        try:
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            importance = optuna.importance.get_param_importances(study, evaluator=evaluator)
        except ImportError:  # fANOVA needs scikit-learn (an MLflow dependency): Optuna's default then
            importance = optuna.importance.get_param_importances(study)
        return {k: float(v) for k, v in importance.items()}
    except (RuntimeError, ValueError):
        return None


def _importance(result, storage_url: str, study_name: str, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    importance = result.importance = knob_importance(storage_url, study_name)
    if not importance:
        return None
    names = list(importance)[::-1]
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(names) + 1.5))
    ax.barh(names, [importance[n] for n in names], color="#1f77b4")
    ax.set(xlabel="importance (share of throughput variation)", title="Knob importance (Optuna, fANOVA)")
    ax.grid(alpha=0.3, axis="x")
    return _done(fig, path)
