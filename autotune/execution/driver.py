"""The search's one loop: `autotune.decide.strategy` chooses, on an Optuna study
(RDB storage in the run dir, resumable); a backend runs each trial
(`autotune.execution.backends`: `local`, one at a time on this host, or `ray`,
Ray Tune on this host or any node of a cluster); each trial runs in a fresh
process (`autotune.execution.launcher`); `autotune.records.recorder` writes each
result everywhere; the stoppers (`autotune.decide.stoppers`) end it, the same
for both backends.

Why a fresh process per trial: knobs such as cudnn.benchmark, compile caches and
the CUDA allocator are process state, and a reused process would carry them from
one trial into the next. With Ray, the actor is the trial's resource reservation;
the child process is its clean room, killed with its loader workers on timeout.

Only the driver writes MLflow, the Optuna storage, trials.csv and best_config.yaml,
as each trial's result arrives, so what finished is on disk at once; a trial on
another node sends its files back with its result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

import optuna

from autotune.execution import program as PG
from autotune import knobs as K
from autotune import workload as W
from autotune._imports import installed
from autotune.execution import backends, loop, startup
from autotune.execution import spread as SP
from autotune.execution.launcher import start_shared, user_thread_env
from autotune.execution.lock import device_lock
from autotune.launch_command import own_knobs as launched_knobs
from autotune.export import best_config as export
from autotune.integrations import tracking
from autotune.records import cache, plots
from autotune.records.recorder import Recorder, reconcile
from autotune.records.run_dir import (
    SearchResult,
    TrialRecord,
    pick_best,
    pruning_savings,
    read_run,
    same_device,
)
from autotune.records.state import STATE_FILE, SearchState
from autotune.records.verdicts import settle
from autotune.safety import program_parity
from autotune.safety.levels import LEVELS, REFERENCE_FILE
from autotune.decide import checked
from autotune.decide.budget import budget_fits, remeasure_cost
from autotune.decide.confirm import confirm_best, window_ci
from autotune.decide.stoppers import Combined, search_stoppers
from autotune.decide.samplers import kind
from autotune.decide.strategy import Strategy
from autotune.execution.reads import Reads
from autotune.decide.reference import read_ci
from autotune.spec import SearchPlan, Spec, SpecError
from autotune.trial import ranks as R
from autotune.trial.measure import FLOPS_FILE
from autotune.trial.result import TrialResult


def run(
    spec: Spec,
    *,
    on_start: Callable | None = None,
    on_trial: Callable | None = None,
    resume: bool = False,
    on_trial_start: Callable | None = None,
    on_wait: Callable[[str], None] | None = None,
    on_remeasure: Callable[[str], None] | None = None,
    factory: Callable | None = None,
    refresh: bool = False,
    on_match: Callable[[str], None] | None = None,
    backend="auto",
    on_probe: Callable[[bool, float], None] | None = None,
) -> SearchResult:
    """Run a search to its end (trial count, time budget, a failed baseline, or
    Ctrl-C / SIGTERM) on `backend` (a backend object, or its name for
    `backends.choose`: auto, local, ray). The spec is read once, here, into the
    search's plan (`SearchPlan.of`); every part below takes its section of the plan.
    With `resume`, continue the search in `spec.output_dir`
    from its Optuna storage: finished trials are neither lost nor repeated.
    Everything that can be checked is checked before anything is written. A
    local search waits while another one measures on the same device (`on_wait`
    hears why). `factory`: the callable a spec's `workload.pickled` names.
    A finished search of the same question on this machine (`autotune.records.cache`) is
    named to `on_match` before the trials start (with `refresh`, it is not looked
    for); `autotune.search(reuse=True)` returns it before this driver is imported. A program's probe
    (autotune.execution.program) is told to `on_probe(running, first_step_limit_s)` as it starts and ends."""
    started = time.perf_counter()
    plan = SearchPlan.of(spec)
    if isinstance(backend, str):
        backend = backends.choose(backend, resources=plan.resources, tracking=plan.tracking)
    run_dir = plan.run_dir
    state = None
    if resume:
        if not SearchState.exists(run_dir):
            raise SpecError(f"`{run_dir}` is not a search's output dir (no {STATE_FILE}); nothing to resume")
        state = SearchState.read(run_dir)
    user_path = W.importable_paths()  # user factories resolve as the trials will resolve them
    user = plan.space.user()
    program = plan.program  # the user's own program (autotune.execution.program)
    source, pickled = (
        (None, None) if program else startup.source(plan.workload, factory=factory, run_dir=run_dir, resume=resume)
    )
    try:  # what needs no torch is checked before anything starts
        user_base = (
            PG.flag_baseline(plan.workload.command, plan.space.workload_args)
            if program
            else W.user_knob_baseline(source, plan.workload.args, user)
        )
    except W.WorkloadError as e:
        raise SpecError(f"workload: {e}") from e
    given = plan.given()
    given.update({K.USER_PREFIX + n: v for n, v in user_base.items()})
    clash = K.conflicts({**K.pytorch_defaults(None), **given})
    if clash:
        raise SpecError(f"baseline: {'; '.join(clash)}")
    K.declare(user)
    if plan.tracking.uri:
        tracking.check_uri(plan.tracking.uri)
    from concurrent.futures import ThreadPoolExecutor

    asked = None if resume or refresh or program else cache.question(plan)
    local_store = not plan.tracking.uri and not resume and not (run_dir / "mlflow.db").exists() and installed("mlflow")
    # a local search's one fork server imports torch while Ray starts (autotune.execution.launcher.SharedForkServer);
    # not with a Ray of the caller's own, whose nodes may be anywhere
    forks = (
        None
        if not backend.shares_forks(plan.resources)
        else start_shared(plan.workload.model_dump(mode="json"), user_path, user_thread_env())
    )

    def probe() -> PG.Program:
        # its first-step limit never past the budget: what this run has left of it (a resumed search's earlier runs
        # not counted, so one stopped near its budget can still be probed, and finish)
        limits = PG.probe_limits(plan.trial.first_step_s, plan.search.time_budget_s, time.perf_counter() - started)
        if on_probe:
            on_probe(True, limits.first_step_s)
        try:
            return PG.probe(
                plan.workload,
                run_dir,
                user_path,
                ranks=plan.resources.ranks_per_trial,
                timeout_s=plan.trial.timeout_s,
                shared=forks.path if forks else None,
                limits=limits,
            )
        finally:
            if on_probe:
                on_probe(False, limits.first_step_s)

    try:
        with ThreadPoolExecutor(1) as pool:  # start-up: the workload builds while Ray starts (see startup.prepare)
            preparing = pool.submit(
                startup.prepare,
                source,
                args=plan.workload.args,
                run_dir=run_dir,
                local_store=local_store,
                probe=probe if program else None,
            )
            started_backend = backend.start(plan.resources)
    except BaseException:
        if forks:
            forks.close()
        raise
    store, closing = None, []  # closing: what ends the search beside Ray's shutdown (_finish)
    try:
        workload, store, optimizer = preparing.result()
        remembered = cache.key(asked, cache.machine(plan.resources.device, workload) if asked else None)
        found = remembered and cache.Lookup(run_dir.parent, asked).match(remembered["machine"])
        if found and on_match:
            on_match(cache.describe(found, reused=False))
        # a program's own settings: its launcher's flags (accelerate's --mixed_precision), then what its probe found
        own = {
            **(launched_knobs(plan.workload.launcher.env) if plan.workload.launcher else {}),
            **(workload.baseline or {}),
        }
        baseline = {**K.pytorch_defaults(workload.batch_size), **own, **given}
        lists, too_big = (
            (plan.space.lists(), [])
            if program
            else startup.fit_batches(plan.space.lists(), baseline["batch_size"], len(workload.dataset))
        )
        resources = plan.resources
        device = dataclasses.replace(
            backend.detect_device(resources),
            optimizer=optimizer,  # fused_optimizer
            ranks=resources.ranks_per_trial,
        )  # the DDP/FSDP knobs
        why = SP.problem(resources.rank_placement, device) or (
            None
            if program
            else R.search_problem(
                SP.one_node(device, resources.rank_placement), workload, resources.blocks, lists, baseline
            )
        )
        why = why or K.asked(plan.space.knobs.given(), device)  # a language model's knob asked for must run
        if why:
            raise SpecError(why)
        if program:  # an own value the device cannot run (a Trainer's pinned memory on a CPU) does nothing there:
            # PyTorch's default stands for it, no baseline replaced (the program keeps its own; no trial sets it)
            baseline.update(PG.inert(own, device, given))
        space = K.resolve_space(
            lists, baseline, device, LEVELS[plan.safety.level], plan.safety.keep_effective_batch, user
        )
        space.dropped += too_big
        if program:  # what it never calls, it cannot take
            PG.fix_unused(space, workload.used, workload.cannot, keep_effective_batch=plan.safety.keep_effective_batch)
        if not space.search:
            raise SpecError(space.nothing_to_search())
        if state and state.space["search"] != space.search:
            raise SpecError(
                f"`{run_dir}` searched {state.space['search']}; this machine resolves the space to "
                f"{space.search}: resume on the same kind of device"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            (run_dir / "spec.yaml").write_text(plan.to_yaml())
            if pickled:  # what --resume and `python -m autotune.trial` load
                (run_dir / W.PICKLE_FILE).write_bytes(pickled)
        tracking.adopt_store(store, run_dir)
        # a cluster's scheduler places trials; on this host, one search per device at a time
        lock = contextlib.nullcontext() if resources.ray_address else device_lock(device.type, run_dir, on_wait)
        with lock as waited:
            started += waited or 0.0  # waiting is not searching (time budget, wall time)
            return _search(
                plan,
                backend,
                device=device,
                space=space,
                started=started,
                state=state,
                user_path=user_path,
                pickled=pickled,
                remembered=remembered,
                fork_socket=forks.path if forks else None,
                closing=closing,
                on_start=on_start,
                on_trial=on_trial,
                on_trial_start=on_trial_start,
                on_remeasure=on_remeasure,
                program=workload.record() if program else None,
            )
    finally:
        tracking.adopt_store(store, None)  # not adopted (a check failed): removed
        with ThreadPoolExecutor(1) as pool:  # the plots and MLflow's last writes while Ray stops (1-2 s each)
            closed = [pool.submit(fn) for fn in closing]
            backend.close(started_backend)
        if forks:
            forks.close()
        for done in closed:
            done.result()  # what failed there is raised here


def _search(
    plan: SearchPlan,
    backend,
    *,
    device: K.Device,
    space: K.Space,
    started: float,
    state: SearchState | None,
    user_path: str | None,
    pickled: bytes | None = None,
    remembered: dict | None = None,
    fork_socket: str | None = None,
    closing: list[Callable[[], None]] | None = None,
    on_start: Callable | None = None,
    on_trial: Callable | None = None,
    on_trial_start: Callable | None = None,
    on_remeasure: Callable[[str], None] | None = None,
    program: dict | None = None,
) -> SearchResult:
    """The trials on `backend`, then the late checks and re-measurements (`_finish`): `device` and `space` as
    `run` resolved them, `started` its clock (`time.perf_counter()`), `state` a resumed search's search.json."""
    run_dir, resources_, search = plan.run_dir, plan.resources, plan.search
    cuda = device.type == "cuda"
    cpus_per_trial = resources_.cpus_per_trial
    gpus_per_trial = resources_.gpus_per_trial  # default: one a rank with CUDA
    if gpus_per_trial is None:
        gpus_per_trial = resources_.ranks_per_trial if cuda else 0

    def cpus_fn(config) -> int:
        # Ray's reservation, not the trial's threads (those are torch's default or
        # the num_threads knob: what the user will run). With a GPU: the loader
        # workers + the main process; a CPU host runs one trial at a time
        if cpus_per_trial:
            return cpus_per_trial
        return min(config["num_workers"] + 1, device.cpus) if cuda else max(1, device.cpus - 1)

    def resources(config) -> dict:
        return {"CPU": cpus_fn(config), "GPU": gpus_per_trial, **resources_.custom}

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opened = startup.open_search(
        device,
        space,
        state,
        run_dir=run_dir,
        name=plan.name,
        workload_ref=plan.workload.ref,
        search=search,
        tracking=plan.tracking,
        remembered=remembered,
    )
    tracker, paths, state, n_trials, storage_url = (
        opened.tracker,
        opened.paths,
        opened.state,
        opened.n_trials,
        opened.storage_url,
    )
    state.program = program
    state.write(run_dir)
    earlier = read_run(run_dir) if (run_dir / "trials.csv").exists() else None
    records: list[TrialRecord] = earlier.records if earlier else []
    recorder = Recorder(tracker, records, paths["trials_csv"], None, space.baseline, earlier.reads if earlier else ())
    study = optuna.create_study(
        study_name=state.optuna_study,
        storage=storage_url,
        direction="maximize",
        load_if_exists=True,
    )  # the strategy installs the spec's sampler on it
    reconcile(study, recorder, space, run_dir)  # interrupted trials are proposed again first
    recorder.on_trial, recorder.on_trial_start = on_trial, on_trial_start
    strategy = Strategy(
        study,
        space.search,
        space.baseline,
        search.sampler,
        min_improvement=search.min_improvement,
        seed=search.seed,
        cuda=device.type == "cuda",
        listed=tuple(plan.space.knobs.given()),
    )
    remaining = n_trials - len(records)
    if on_start:
        on_start(device, space, run_dir, n_trials, search.time_budget_s)
    for record in sorted(records, key=lambda r: r.number) if on_trial else ():
        on_trial(record)  # what an earlier run of this search finished

    base_knobs = {k: v for k, v in space.baseline.items() if k in K.KNOBS}
    settings = {
        "request": plan.trial_settings(
            device.type,
            space.baseline,
            parity={
                # the baseline's parity reference: computed by the first trial that needs it, then reused
                "baseline": base_knobs,
                "steps": plan.safety.parity_steps,
                "tolerance": plan.safety.tolerance,
                "reference": str(run_dir / REFERENCE_FILE),
            },
            flops_cache=str(run_dir / FLOPS_FILE),
            pickled=pickled,  # trials load the run dir's workload.pkl (bytes in `settings` for other nodes)
        ),
        "timeout_s": plan.trial.timeout_s,
        "first_step_s": plan.trial.first_step_s if plan.program else None,  # a program's (autotune.execution.watch)
        "run_dir": str(run_dir),
        "user_path": user_path,
        # Ray sets OMP_NUM_THREADS in its workers; a trial runs with the user's own
        "thread_env": user_thread_env(),
        "workload_pickle": pickled,
        "rank_placement": resources_.rank_placement,
        "fork_socket": fork_socket,  # a local search's shared fork server
        **backend.trial_settings(),
    }
    budget = search.time_budget_s

    def budget_left() -> float | None:  # the whole search's: the re-measurement too stops at its end
        return budget - (time.perf_counter() - started + opened.wall_before) if budget else None

    def reserve() -> float:  # kept aside at the budget's end for the re-measurement
        return remeasure_cost(recorder.records, search.confirm_rounds)

    fits = budget_fits(records, space.baseline, budget, started, space.conflicts, reserve)  # what runs in time
    stop, interrupted, exhausted = search_stoppers(
        recorder,
        n_trials=n_trials,
        budget_s=budget,
        patience=None if kind(search.sampler).exhaustive else search.patience,  # a grid maps every point
        min_improvement=search.min_improvement,
        started=started,
        wall_before=opened.wall_before,
        reserve=reserve,
    )
    # the baseline read again between trials (autotune.decide.reference), where trials run one at a time here
    reader = backend.reader(settings, cuda=cuda, target_ci=read_ci(plan.trial.target_ci, device.type))
    reads = (
        Reads(
            study,
            strategy,
            recorder,
            reader,
            dict(space.baseline),
            started=time.time() - (time.perf_counter() - started) - opened.wall_before,
            device=device.type,
            share=search.reference_share,
        )
        if reader and search.reference_share
        else None
    )
    proposer = loop.Proposer(
        strategy,
        {k: v for k, v in space.baseline.items() if k not in space.search},
        plan.trial.prune_margin,
        fits,
        exhausted,
        reads,
    )
    backend.run_trials(
        proposer,
        recorder,
        stop,
        interrupted,
        settings=settings,
        reserve=resources,
        remaining=remaining,
        resources=resources_,
        time_budget_s=budget,
        cuda=cuda,
    )
    if reads is not None and not interrupted.set:
        try:  # the incumbent read afresh where it is not yet, and the reference once more (Ctrl-C: as it stands)
            reads.at_end()
        except KeyboardInterrupt:
            interrupted.set = True
        recorder.rejudge()  # every trial's figures with every read

    with backend.remeasurers(settings) as runner:  # the late checks and the re-measurements

        def remeasure(baseline: TrialRecord | None, best: TrialRecord | None) -> dict | None:
            need = max(
                (resources(r.knobs) for r in (baseline, best) if r), key=lambda r: (r["CPU"], r["GPU"]), default={}
            )
            ci = window_ci(baseline, best, plan.trial.target_ci)
            return confirm_best(
                runner(need, target_ci=ci), baseline, best, search.confirm_rounds, on_remeasure, budget_left
            )

        def check(knobs: dict, label: str) -> TrialResult:  # a late loss-parity check (autotune.decide.checked)
            if not plan.program:
                return runner(resources(knobs), parity_only=True)(knobs, label)

            def run(k: dict, lab: str, noise: dict | None = None) -> TrialResult:
                return runner(resources(k), parity_only=True, noise=noise)(k, lab)

            base = dict(space.baseline)
            parity, failed = program_parity.check(
                run,
                knobs,
                base,
                settings["request"].parity,
                device_type=device.type,
                path=run_dir / program_parity.REFERENCE_FILE,
                label=label,
                seed=search.seed,
            )
            return failed or TrialResult(status="ok", knobs=knobs, parity=parity)

        return _finish(
            plan,
            device=device,
            space=space,
            started=started,
            opened=opened,
            recorder=recorder,
            stop=stop,
            strategy=strategy,
            remeasure=remeasure,
            check=check,
            announce=on_remeasure,
            closing=closing,
        )


def _finish(
    plan: SearchPlan,
    *,
    device: K.Device,
    space: K.Space,
    started: float,
    opened: startup.Opened,
    recorder: Recorder,
    stop: Combined,
    strategy: Strategy,
    remeasure: Callable[[TrialRecord, TrialRecord], dict | None],
    check: Callable[[dict, str], dict],
    announce: Callable[[str], None] | None = None,
    closing: list[Callable[[], None]] | None = None,
) -> SearchResult:
    """Speedups of trials that finished before the baseline, the best
    re-measured against the baseline (autotune.decide.confirm), the best config, why
    the search ended, the plots, and the parent run closed. The best's loss
    parity is checked late where its trial did not run it (autotune.decide.checked),
    and a best the re-measurement rejects hands over to the next candidates
    (`checked.confirm_candidates`)."""
    run_dir, search = plan.run_dir, plan.search
    tracker, paths, state, n_trials, records = (
        opened.tracker,
        opened.paths,
        opened.state,
        opened.n_trials,
        recorder.records,
    )
    baseline = recorder.baseline()
    if baseline and baseline.throughput:  # trials that finished before the baseline did
        for r in records:
            if r.throughput and r.speedup is None and same_device(baseline, r):
                r.add_derived(speedup_x=r.throughput / baseline.throughput)
                tracker.log_metrics(r.mlflow_run_id, {"speedup_x": r.speedup})
        recorder.write()
    ok = [r for r in records if r.throughput]
    best = pick_best(records)
    wall = time.perf_counter() - started + opened.wall_before  # a resumed search counts all its runs
    ended, stopped = stop.reason or "interrupted", None
    if recorder.baseline_failed:
        stopped = f"the baseline failed ({baseline.error_type}: {baseline.error}); nothing can be compared"
    elif ended == "interrupted":
        stopped = (
            f"interrupted after {len(records)} of {n_trials} trials; continue with `autotune search --resume {run_dir}`"
        )
    confirm = None
    try:
        if not stopped:
            budget_left = (
                (lambda: search.time_budget_s - (time.perf_counter() - started + opened.wall_before))
                if search.time_budget_s
                else (lambda: None)
            )
            best, confirm, rejected = checked.confirm_candidates(
                records,
                baseline,
                remeasure,
                check,
                announce,
                min_improvement=search.min_improvement,
                budget_left=budget_left,
            )
            if rejected:
                state.confirm_rejected = rejected
    except KeyboardInterrupt:  # Ctrl-C while checking or re-measuring: what is known is still exported
        stopped, ended, confirm = "interrupted while checking and re-measuring the best", "interrupted", None
        best = pick_best(records)
    recorder.write()  # late parity verdicts
    if confirm:
        state.confirm = confirm
        wall = time.perf_counter() - started + opened.wall_before
    state.skipped_predicted = strategy.skipped_predicted()
    result = SearchResult(
        run_dir,
        space,
        device,
        records,
        baseline,
        best,
        wall,
        paths,
        stopped,
        ended,
        confirm,
        skipped=state.skipped_predicted,
        reads=recorder.reads,
    )
    settle(result)  # a best that did not beat the baseline in every pair ties with it
    best = result.best
    summary = {"search_wall_s": wall, "trials": len(records), "trials_ok": len(ok), **pruning_savings(records)}
    if result.reads_share:  # what the reference reads cost (autotune.decide.reference)
        summary.update({f"reads_{k}" if k == "share" else k: v for k, v in result.reads_share.items() if v is not None})
    if baseline and baseline.throughput and best:
        export.write_best_config(
            result,
            paths["best_config"],
            name=plan.name,
            workload=plan.workload,
            flags=plan.space.flags(),
            ranks=plan.resources.ranks_per_trial,
            blocks=plan.resources.blocks,
            keep_effective_batch=plan.safety.keep_effective_batch,
            program=state.program,
        )
        summary.update(
            {result.unit.key("baseline"): baseline.throughput, result.unit.key("best"): best.throughput},
            speedup_x=result.speedup,
            # the search's own figure of the best (its fresh reads', or its ratio to the reference at its time)
            trials_speedup_x=result.search_speedup,
        )
        if confirm and confirm.get("speedup_x"):
            summary.update(
                confirm_rounds=confirm["rounds"],
                confirm_speedup_low=confirm["speedup_low"],
                confirm_speedup_high=confirm["speedup_high"],
            )
    dataclasses.replace(state, wall_s=wall, stopped_reason=stopped, ended=ended).write(run_dir)
    tracker.tag_search({"ended": ended})

    def close() -> None:  # the plots (where matplotlib is installed), then the parent run closed with them
        plot_files = (
            plots.write_all(result, opened.storage_url, state.optuna_study) if ok and installed("matplotlib") else []
        )
        tracker.finish(
            summary,
            [paths["best_config"], paths["trials_csv"], run_dir / "spec.yaml", SearchState.path(run_dir)],
            status="FAILED" if stopped else "FINISHED",
            plots=plot_files,
            result=result,  # its answer on MLflow's first screen (tracking.Tracker.tell)
        )

    if closing is None:
        close()
    else:  # the caller runs it beside Ray's shutdown (run)
        closing.append(close)
    return result
