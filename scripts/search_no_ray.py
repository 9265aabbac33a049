"""A search on a host without Ray or MLflow (the GPU hosts: torch, optuna,
pandas, pyyaml): the same `autotune.strategy.Strategy` and the same trial runner
(`autotune.launcher.run_in_process`: a fresh process per trial, the request
built by `autotune.request.TrialSettings`)
as `autotune search`, one trial at a time, on an in-memory Optuna study (copied
to optuna.db at the end). Writes the run-dir format, so `autotune report DIR`
and `autotune export DIR` read it: trials.csv, search.json, best_config.yaml,
trials/NNNN/{config,result}.json.

    python scripts/search_no_ray.py SPEC.yaml [--output-dir DIR]

The spec: with pydantic installed it is read and checked by `autotune.spec`;
without it (the GPU hosts), by a small reader here (YAML, the same sections and
defaults, unknown keys refused) that checks less (types and values are checked
by the trial runner, `autotune.trial.check_config`), and says so. Not
supported here: `resources.ray_address`, `rank_placement: spread` and `tracking`
(MLflow), `--resume`.

A readable line per trial; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from autotune import knobs as K  # noqa: E402
from autotune import workload as W  # noqa: E402
from autotune.trial.runner import DEFAULTS as TRIAL_DEFAULTS  # noqa: E402

# the spec's sections and their defaults (autotune/spec.py), for hosts without pydantic
SECTIONS = {
    "name": None, "workload": None, "baseline": {}, "search_space": "default", "output_dir": None,
    "trial": {**{k: TRIAL_DEFAULTS[k] for k in ("warmup_steps", "min_window_s", "target_ci", "max_window_s",
                                                "profile_steps", "diagnose")}, "measure_steps": None,
              "timeout_s": 600.0, "prune_margin": 0.2},
    "search": {"sampler": "autotune", "strategy": "v2", "n_trials": None, "time_budget_s": None, "seed": 0, "patience": None,
               "min_improvement": 0.02, "confirm_rounds": 2},
    "resources": {"device": "auto", "cpus_per_trial": None, "gpus_per_trial": None, "ray_address": None, "custom": {},
                  "ranks_per_trial": 1, "rank_placement": "pack", "blocks": None, "memory_limit_gib": None},
    "safety": {"level": "numerics", "tolerance": 0.05, "parity_steps": 20, "keep_effective_batch": False},
    "tracking": {"uri": None, "experiment": "autotune"},
}


class SpecError(Exception):
    pass


def read_spec(path: Path) -> tuple[dict, str]:
    """The spec as plain data (the sections of SECTIONS, defaults filled), and
    which reader read it."""
    try:
        from autotune import spec as S
    except ImportError:  # no pydantic: the small reader
        return _read_plain(path), "plain YAML reader (pydantic not installed: fewer checks)"
    try:
        spec = S.load(path)
    except S.SpecError as e:
        raise SpecError(str(e)) from None
    data = spec.model_dump(mode="json")
    data["search_space"] = {"lists": spec.search_space.lists(), "user": spec.search_space.user(),
                            "listed": list(spec.search_space.knobs.given())}
    return data, "autotune.spec"


def _read_plain(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("workload"), dict):
        raise SpecError(f"{path}: the spec must be a YAML mapping with a `workload` mapping")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise SpecError(f"{path}: unknown key `{sorted(unknown)[0]}`; allowed: {', '.join(SECTIONS)}")
    data = {}
    for section, default in SECTIONS.items():
        given = raw.get(section)
        if isinstance(default, dict) and section != "baseline":
            given = given or {}
            bad = set(given) - set(default)
            if bad:
                raise SpecError(f"{path}: {section}: unknown key `{sorted(bad)[0]}`; allowed: {', '.join(default)}")
            data[section] = {**default, **given}
        else:
            data[section] = default if given is None else given
    wl = data["workload"]
    if bool(wl.get("name")) == bool(wl.get("factory")):
        raise SpecError(f"{path}: workload: give exactly one of `name` (built-in) or `factory` (pkg.module:function)")
    bad = set(data["baseline"]) - set(K.KNOBS)
    if bad:
        raise SpecError(f"{path}: baseline: unknown knob `{sorted(bad)[0]}`; knobs: {', '.join(K.KNOBS)}")
    space = data["search_space"]
    space = {"preset": space} if isinstance(space, str) else {"preset": "default", **(space or {})}
    lists = {}
    if space.get("preset"):
        preset = ROOT / "search_spaces" / f"{space['preset']}.yaml"
        if not preset.exists():
            raise SpecError(f"{path}: search_space.preset: unknown preset `{space['preset']}`")
        lists = yaml.safe_load(preset.read_text()) or {}
    bad = set(space) - {"preset", "knobs", "workload_args"}
    if bad:
        raise SpecError(f"{path}: search_space: unknown key `{sorted(bad)[0]}`; allowed: preset, knobs, workload_args")
    lists.update(space.get("knobs") or {})
    bad = set(lists) - set(K.KNOBS)
    if bad:
        raise SpecError(f"{path}: search_space: unknown knob `{sorted(bad)[0]}`; knobs: {', '.join(K.KNOBS)}")
    user, stages = {}, [s for s in K.STAGES if s != "workload"]
    for name, k in (space.get("workload_args") or {}).items():  # as autotune.spec's UserKnob
        k = {"values": k} if isinstance(k, list) else k
        if not (str(name).isidentifier() and isinstance(k, dict) and isinstance(k.get("values"), list) and k["values"]
                and set(k) <= {"values", "safety", "stage"} and k.get("safety", "dynamics") in K.SAFETY_CLASSES
                and k.get("stage") in (None, *stages)):
            raise SpecError(f"{path}: search_space.workload_args.{name}: give a list of values or {{values: [...], "
                            f"safety: {' | '.join(K.SAFETY_CLASSES)}, stage: {' | '.join(stages)}}}")
        user[name] = {"safety": k.get("safety", "dynamics"), "stage": k.get("stage")}
        lists[K.USER_PREFIX + name] = k["values"]
    data["search_space"] = {"lists": {k: list(dict.fromkeys(v)) for k, v in lists.items()}, "user": user,
                            "listed": list(space.get("knobs") or {})}
    data["name"] = data["name"] or path.stem
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--output-dir", type=Path, help="the run dir (default: the spec's output_dir, else runs/NAME-TIME)")
    args = p.parse_args(argv)
    try:
        data, reader = read_spec(args.spec)
        if data["resources"]["ray_address"]:
            raise SpecError("resources.ray_address: a cluster needs Ray; run `autotune search` there")
        if data["resources"]["rank_placement"] == "spread" and data["resources"]["ranks_per_trial"] > 1:
            raise SpecError("resources.rank_placement: spread puts ranks on a cluster's nodes, which needs Ray; "
                            "use pack (one node) here, or run `autotune search` on the cluster")
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return search(data, reader, args.output_dir)


def search(data: dict, reader: str, output_dir: Path | None) -> int:
    import optuna

    from autotune.decide.budget import trial_cap
    from autotune.decide.checked import confirm_candidates
    from autotune.decide.confirm import confirm_best, describe, reread_anchor, settle, window_ci
    from autotune.export.best_config import write_best_config
    from autotune.records.run_dir import (SearchResult, add_speedup, pick_best, record_of, run_paths, trial_dir_of, write_csv,
                                  write_state)
    from autotune.safety.levels import LEVELS
    from autotune.execution.launcher import run_in_process, user_thread_env
    from autotune.trial.result import TrialResult
    from autotune.trial.request import TrialSettings
    from autotune.decide.budget import NOTHING_LEFT, budget_fits, no_improvement_for
    from autotune.decide.strategy import Strategy, told
    from autotune.trial.runner import detect_device

    started = time.perf_counter()
    settings = data["search"]
    run_dir = (output_dir or (Path(data["output_dir"]) if data["output_dir"] else
                              Path("runs") / f"{data['name']}-{datetime.now():%Y%m%d-%H%M%S}")).resolve()
    user_path = W.importable_paths()  # user factories resolve as the trials will resolve them
    wl = data["workload"]
    ref, user = wl.get("factory") or wl["name"], data["search_space"].get("user") or {}
    workload = W.load(ref, wl.get("args"))
    device = dataclasses.replace(detect_device(data["resources"]["device"]), optimizer=K.optimizer_of(workload))
    K.declare(user)
    baseline = {**K.pytorch_defaults(workload.batch_size), **{k: v for k, v in data["baseline"].items() if v is not None},
                **{K.USER_PREFIX + n: v for n, v in W.user_knob_baseline(ref, wl.get("args") or {}, user).items()}}
    space = K.resolve_space(data["search_space"]["lists"], baseline, device, LEVELS[data["safety"]["level"]],
                            data["safety"]["keep_effective_batch"], user)
    if not space.search:
        print(f"error: {space.nothing_to_search()}", file=sys.stderr)
        return 2
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items()}, sort_keys=False))
    budget = settings["time_budget_s"]
    n_trials = trial_cap(space.search, settings["n_trials"], budget, settings["sampler"])  # as autotune.driver
    state = {"name": data["name"], "device": dataclasses.asdict(device), "space": dataclasses.asdict(space),
             "n_trials": n_trials, "time_budget_s": budget, "mlflow_uri": None, "optuna_study": data["name"],
             "runner": "scripts/search_no_ray.py", "spec_reader": reader,
             "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_state(run_dir, state)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=data["name"], direction="maximize",
                                sampler=Strategy.make_sampler(settings["sampler"], settings["seed"]))
    v2 = settings["strategy"] == "v2"  # as autotune.driver: pay for information where a decision needs it
    strategy = Strategy(study, space.search, space.baseline, settings["sampler"], settings["min_improvement"],
                        settings["seed"], cuda=device.type == "cuda", predict=v2,
                        listed=data["search_space"]["listed"])
    print(f"search {data['name']} on {device.type}:{device.name} ({device.cpus} CPUs), spec read by {reader}; "
          f"searching {', '.join(f'{k}={v}' for k, v in space.search.items())}; run dir {run_dir}")
    records = []

    fits = budget_fits(records, space.baseline, budget, started, space.conflicts)  # as autotune.driver

    request = TrialSettings.of(data, device.type, space.baseline)
    thread_env = user_thread_env()  # as autotune.driver

    def run_one(config: dict, trial_dir: Path) -> dict:  # one trial, a fresh process
        return run_in_process(config, trial_dir, data["trial"]["timeout_s"], user_path, thread_env)

    ended = f"{n_trials} trials"
    baseline_record = None
    try:
        while len(records) < n_trials:
            if budget and time.perf_counter() - started >= budget:
                ended = "the time budget"
                break
            if settings["patience"] and no_improvement_for([r.throughput if r.safe else None for r in records],
                                                           settings["min_improvement"]) >= settings["patience"]:
                ended = f"no gain above {settings['min_improvement']:.0%} in {settings['patience']} trials"
                break
            proposal = strategy.ask(fits)
            if proposal is None:
                ended = NOTHING_LEFT
                break
            knobs = {**space.baseline, **proposal.params}
            number = proposal.trial.number
            bar = strategy.incumbent_bar(v2, proposal.params)
            config = request.config(knobs, strategy.prune_below(data["trial"]["prune_margin"]),
                                    predicted=proposal.predicted, **bar)
            trial_dir = trial_dir_of(run_dir, number)
            raw = run_one(config, trial_dir)
            if bar.get("anchor"):  # as autotune.raytune: v2's first incumbent read twice
                raw = reread_anchor(raw, request.timed_only().config(knobs, anchor=True), run_one, trial_dir)
            result = TrialResult.from_dict(raw)  # the runner's boundary, checked
            record = record_of(number, knobs, result, trial_dir, is_baseline=baseline_record is None)  # as the recorder
            add_speedup(record, baseline_record or record)
            if record.is_baseline:
                baseline_record = record
            records.append(record)
            strategy.tell(proposal.trial, record.status, record.metrics.get("samples_per_s"), safe=record.safe,
                          error=f"{record.error_type}: {record.error}" if record.error else None,
                          diagnosis=record.diagnosis, attrs=told(result, space.baseline))
            write_csv(records, run_dir / "trials.csv")
            changed = ", ".join(f"{k}={v}" for k, v in knobs.items() if v != space.baseline[k]) or "baseline"
            tp = record.metrics.get("samples_per_s")
            speedup = "-" if record.speedup is None else f"{record.speedup:.2f}x"
            print(f"{number:3d} {proposal.source:8} {record.status:7} {'-' if tp is None else f'{tp:.1f}':>9} samples/s "
                  f"{speedup:>6} {(record.diagnosis or {}).get('bottleneck', '-'):8} "
                  f"{record.info.get('trial_wall_s', 0):6.1f}s  {changed}", flush=True)
            if baseline_record is record and not record.throughput:
                ended = "the baseline failed"
                break
    except KeyboardInterrupt:
        ended = "interrupted"
    best = pick_best(records)
    confirm = None

    def runner(plain):
        return lambda knobs, label: TrialResult.from_dict(run_one(plain.config(knobs), run_dir / "confirm" / label))

    def remeasure(baseline, best):  # as autotune.driver: v2's windows sized by the gap the trials measured
        ci = window_ci(baseline, best, data["trial"]["target_ci"]) if v2 else None
        return confirm_best(runner(request.timed_only(ci)), baseline, best, settings["confirm_rounds"], print, early=v2)

    if ended != "interrupted" and v2:  # as autotune.driver: late parity checks, the candidates re-measured
        best, confirm, rejected = confirm_candidates(records, baseline_record, remeasure, runner(request.parity_check()),
                                                     print, settings["min_improvement"])
        write_csv(records, run_dir / "trials.csv")
        if rejected:
            state["confirm_rejected"] = rejected
    elif ended != "interrupted":  # the best re-measured against the baseline
        confirm = remeasure(baseline_record, best)
    if confirm:
        state["confirm"] = confirm
    state["skipped_predicted"] = strategy.skipped_predicted()
    wall = time.perf_counter() - started
    paths = run_paths(run_dir)
    result = SearchResult(run_dir, space, device, records, baseline_record, best, wall, paths, None, ended, confirm,
                          skipped=state["skipped_predicted"])
    settle(result)
    best = result.best
    spec_view = SimpleNamespace(name=data["name"], workload=SimpleNamespace(ref=wl.get("factory") or wl["name"],
                                                                            args=wl.get("args") or {}),
                                safety=SimpleNamespace(keep_effective_batch=data["safety"]["keep_effective_batch"]),
                                resources=SimpleNamespace(ranks_per_trial=data["resources"]["ranks_per_trial"],
                                                          blocks=data["resources"]["blocks"]))
    if baseline_record and baseline_record.throughput and best:
        write_best_config(result, spec_view, paths["best_config"])
    try:  # for `autotune report`: the study's importances
        optuna.copy_study(from_study_name=data["name"], from_storage=study._storage,
                          to_storage=f"sqlite:///{paths['optuna_storage']}")
    except Exception as e:  # noqa: BLE001 (no SQLite driver: the report does without importances)
        print(f"note: optuna.db not written ({type(e).__name__}: {e})")
    write_state(run_dir, {**state, "wall_s": wall, "stopped_reason": "interrupted" if ended == "interrupted" else None,
                          "ended": ended})
    summary = {"run_dir": str(run_dir), "trials": len(records), "wall_s": round(wall, 1), "ended": ended,
               "spec_reader": reader, "device": f"{device.type}:{device.name}"}
    if baseline_record and baseline_record.throughput and best:
        summary.update(baseline_samples_per_s=round(baseline_record.throughput, 1),
                       best_samples_per_s=round(best.throughput, 1), speedup_x=result.speedup and round(result.speedup, 3),
                       trials_speedup_x=round(best.throughput / baseline_record.throughput, 3),
                       best_knobs={k: v for k, v in best.knobs.items() if v != space.baseline[k]})
        if confirm:
            print(describe(confirm))
        speedup = f"{summary['speedup_x']:.2f}x" if summary["speedup_x"] else "unknown speedup over"
        print(f"best: {best.throughput:.1f} samples/s, {speedup} the baseline "
              f"({', '.join(f'{k}={v}' for k, v in summary['best_knobs'].items()) or 'the baseline'}); "
              f"{len(records)} trials in {wall:.0f} s; ended: {ended}")
    print(json.dumps(summary))
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
