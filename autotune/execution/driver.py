"""The search: one object (`Search`, the shape of Ray Tune's TuneController: its state as fields, each phase a
method), from its plan to its result. `autotune.decide.strategy` chooses, on an Optuna study (RDB storage in the
run dir, resumable); a backend runs each trial (`autotune.execution.backends`: `local`, one at a time on this host,
or `ray`, Ray Tune on this host or any node of a cluster); each trial runs in a fresh process
(`autotune.execution.launcher`); `autotune.records.recorder` writes each result everywhere; the stoppers
(`autotune.decide.stoppers`) end it, the same for both backends. Its phases, in order:

- `open`: the plan checked (what needs no torch first), the workload built or probed beside the backend's start
  (`autotune.execution.source`: a factory or the user's program, asked, never branched on), the device found and
  the space resolved; a resumed search's search.json read back;
- `start`: the MLflow parent run and search.json, the recorder, the study, the strategy and the stoppers; the
  trials' settings (`RunSettings`);
- `run_trials`: the trials on the backend until a stopper says stop, the reference reads between them;
- `remeasure`: the late loss-parity checks, and the best re-measured against the baseline (the next candidate where
  it loses), within the time budget;
- `finish`: the verdicts, best_config.yaml (the winner's compiled artifacts beside it), the summary, the parent run
  closed (beside the backend's close); the trials' shared compile cache removed (`search.keep_compile_cache`).

Why a fresh process per trial: knobs such as cudnn.benchmark, in-memory compiled graphs and the CUDA allocator are
process state, and a reused process would carry them from one trial into the next (the on-disk compile cache is
shared on purpose: a graph is compiled once per search, and each trial records what its compile cost then). With Ray, the actor is the trial's
resource reservation; the child process is its clean room, killed with its loader workers on timeout.

Only the driver writes MLflow, the Optuna storage, trials.csv and best_config.yaml, as each trial's result
arrives, so what finished is on disk at once; a trial on another node sends its files back with its result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, Iterable

import optuna

from autotune import knobs as K
from autotune import workload as W
from autotune._imports import installed
from autotune.decide import checked
from autotune.decide.budget import budget_fits, remeasure_cost
from autotune.decide.confirm import NEXT, SearchReads, confirm_best, labelled, window_ci
from autotune.decide.deadlines import Deadlines
from autotune.decide.reference import read_ci
from autotune.decide.samplers import kind
from autotune.decide.stoppers import search_stoppers
from autotune.decide.strategy import Facts, Strategy
from autotune.execution import backends, startup
from autotune.execution.proposer import Proposer
from autotune.execution import spread as SP
from autotune.execution.callbacks import Callbacks, SearchCallback
from autotune.execution.launcher import start_shared, user_thread_env
from autotune.execution.lock import device_lock
from autotune.execution.protocol import TrialRun
from autotune.execution.reads import Reads
from autotune.execution.settings import RunSettings
from autotune.execution.source import source_of
from autotune.export import best_config as export
from autotune.integrations import tracking
from autotune.records import cache, plots
from autotune.records.recorder import Recorder, reconcile
from autotune.records.run_dir import (
    SearchResult,
    TrialRecord,
    compile_cache_of,
    pick_best,
    pruning_savings,
    read_run,
    same_device,
)
from autotune.records.state import STATE_FILE, SearchState
from autotune.records.verdicts import settle
from autotune.safety.levels import LEVELS, REFERENCE_FILE
from autotune.spec import Resources, Spec, SpecError
from autotune.plan import SearchPlan
from autotune.trial.measure import FLOPS_FILE
from autotune.trial.result import TrialResult


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A config's Ray resources (what Ray pickles with the trainable: plain data only): the spec's CPUs a trial,
    else with a GPU its loader workers and the main process, on a CPU host all but one core (one trial at a
    time); its GPUs (one a rank with CUDA); the spec's custom resources."""

    resources: Resources
    device: K.Device

    def __call__(self, config: dict) -> dict:
        res, device = self.resources, self.device
        cuda = device.type == "cuda"
        gpus = res.gpus_per_trial if res.gpus_per_trial is not None else (res.ranks_per_trial if cuda else 0)
        # Ray's reservation, not the trial's threads (those are torch's default or the num_threads knob)
        cpus = res.cpus_per_trial or (min(config["num_workers"] + 1, device.cpus) if cuda else max(1, device.cpus - 1))
        return {"CPU": cpus, "GPU": gpus, **res.custom}


@dataclasses.dataclass
class Options:
    """How a search is run beside its spec: `resume` the one in the spec's output_dir (its Optuna storage:
    finished trials neither lost nor repeated); `refresh`: search even where an earlier identical search is
    remembered (autotune.records.cache), and name none; `factory`: the callable a spec's `workload.pickled`
    names."""

    resume: bool = False
    refresh: bool = False
    factory: Callable | None = None


class Search:
    """One search (see the module doc). `backend`: a backend object, or its name for `backends.choose` (auto,
    local, ray); `callbacks`: what hears its progress (autotune.execution.callbacks)."""

    def __init__(
        self,
        spec: Spec,
        *,
        backend="auto",
        callbacks: Iterable[SearchCallback] = (),
        options: Options | None = None,
    ):
        self.started = time.perf_counter()  # the search's clock; a wait for the device lock is taken off it
        self.plan = SearchPlan.of(spec)
        self.options = options or Options()
        self.tell = Callbacks(callbacks)
        self.backend = (
            backends.choose(backend, resources=self.plan.resources, tracking=self.plan.tracking)
            if isinstance(backend, str)
            else backend
        )
        self.run_dir = self.plan.run_dir
        self.state: SearchState | None = None
        self.closing: list[Callable[[], None]] = []  # what ends the search beside the backend's close
        self.forks = self.store = self.backend_started = None
        self.remeasured = 0  # re-measurements so far: a later candidate's pairs get dirs of their own (`_confirm`)

    # --- the phases -------------------------------------------------------------------------------------------

    def run(self) -> SearchResult:
        """Run the search to its end (trial count, time budget, a failed baseline, or Ctrl-C / SIGTERM). Everything
        that can be checked is checked before anything is written. A local search waits while another one measures
        on the same device (`on_wait` hears why)."""
        try:
            self.open()
            # a cluster's scheduler places trials; on this host, one search per device at a time
            lock = (
                contextlib.nullcontext()
                if self.plan.resources.ray_address
                else device_lock(self.device.type, self.run_dir, self.tell.on_wait)
            )
            with lock as waited:
                self.started += waited or 0.0  # waiting is not searching (time budget, wall time)
                self.start()
                self.run_trials()
                with self.backend.remeasurers(self.settings) as runner:
                    self.remeasure(runner)
                return self.finish()
        finally:
            self.close()

    def open(self) -> None:
        """The plan checked, the workload built (or a program probed) beside the backend's start, the device found
        and the space resolved (a resumed search's must be the one it searched)."""
        plan, options = self.plan, self.options
        if options.resume:
            if not SearchState.exists(self.run_dir):
                raise SpecError(f"`{self.run_dir}` is not a search's output dir (no {STATE_FILE}); nothing to resume")
            self.state = SearchState.read(self.run_dir)
        self.user_path = W.importable_paths()  # user factories resolve as the trials will resolve them
        self.source = source_of(plan, factory=options.factory, resume=options.resume, user_path=self.user_path)
        self.given = self._given()  # what needs no torch is checked before anything starts
        if plan.tracking.uri:
            tracking.check_uri(plan.tracking.uri)
        asked = None if options.resume or options.refresh else self.source.cache_question()
        workload, optimizer = self._build()
        self.remembered = cache.key(asked, cache.machine(plan.resources.device, workload) if asked else None)
        found = self.remembered and cache.Lookup(self.run_dir.parent, asked).match(self.remembered["machine"])
        if found:
            self.tell.on_match(cache.describe(found, reused=False))
        self.workload = workload
        self.device = dataclasses.replace(
            self.backend.detect_device(plan.resources), optimizer=optimizer, ranks=plan.resources.ranks_per_trial
        )  # the fused optimizer's class, the DDP/FSDP knobs
        self.reservation = Reservation(plan.resources, self.device)
        self.space = self._space(workload)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not options.resume:
            (self.run_dir / "spec.yaml").write_text(plan.to_yaml())
            if self.source.pickled:  # what --resume and `python -m autotune.trial` load
                (self.run_dir / W.PICKLE_FILE).write_bytes(self.source.pickled)
        tracking.adopt_store(self.store, self.run_dir)

    def start(self) -> None:
        """The search's records opened (MLflow's parent run, search.json), the study, the strategy, the stoppers
        and the trials' settings; a resumed search's finished trials told to the callbacks."""
        plan, space, search = self.plan, self.space, self.plan.search
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.opened = opened = startup.open_search(plan, self.device, space, self.state, remembered=self.remembered)
        self.state = opened.state
        self.state.program = self.source.record(self.workload)
        self.state.write(self.run_dir)
        earlier = read_run(self.run_dir) if (self.run_dir / "trials.csv").exists() else None
        records: list[TrialRecord] = earlier.records if earlier else []
        self.recorder = Recorder(
            opened.tracker,
            records,
            opened.paths["trials_csv"],
            self.tell,
            space.baseline,
            earlier.reads if earlier else (),
        )
        self.study = optuna.create_study(
            study_name=self.state.optuna_study, storage=opened.storage_url, direction="maximize", load_if_exists=True
        )  # the strategy installs the spec's sampler on it
        reconcile(self.study, self.recorder, space, self.run_dir)  # interrupted trials are proposed again first
        self.strategy = Strategy(
            self.study,
            space.search,
            space.baseline,
            search.sampler,
            min_improvement=search.min_improvement,
            seed=search.seed,
            facts=Facts(
                cuda=self.device.type == "cuda", listed=tuple(plan.space.knobs.given()), user_knobs=plan.user_knobs
            ),
        )
        self.settings = self._settings()
        self.tell.on_start(self.device, space, self.run_dir, opened.n_trials, search.time_budget_s)
        for record in sorted(records, key=lambda r: r.number):
            self.tell.on_trial(record)  # what an earlier run of this search finished

    def run_trials(self) -> None:
        """The trials on the backend until a stopper says stop; the reference reads between them (where trials run
        one at a time here), and the incumbent read afresh at the end."""
        search, opened, recorder = self.plan.search, self.opened, self.recorder
        budget = search.time_budget_s
        fits = budget_fits(
            recorder.records, self.space.baseline, budget, self.started, self.space.conflicts, self.reserve
        )
        self.stop, self.interrupted, exhausted = search_stoppers(
            recorder,
            n_trials=opened.n_trials,
            budget_s=budget,
            patience=None if kind(search.sampler).exhaustive else search.patience,  # a grid maps every point
            min_improvement=search.min_improvement,
            started=self.started,
            wall_before=opened.wall_before,
            reserve=self.reserve,
        )
        reads = self._reads()
        proposer = Proposer(
            self.strategy,
            {k: v for k, v in self.space.baseline.items() if k not in self.space.search},
            self.plan.trial.prune_margin,
            fits,
            exhausted,
            reads,
            watch=self._watch,
        )
        self.backend.run_trials(
            TrialRun(
                proposer,
                recorder,
                self.stop,
                self.interrupted,
                settings=self.settings,
                reserve=self.reservation,
                remaining=opened.n_trials - len(recorder.records),
                resources=self.plan.resources,
                time_budget_s=budget,
                cuda=self.device.type == "cuda",
                on_trial_start=self.tell.on_trial_start,
            )
        )
        if reads is not None and not self.interrupted.set:
            try:  # the incumbent read afresh where it is not yet, and the reference once more (Ctrl-C: as it stands)
                reads.at_end()
            except KeyboardInterrupt:
                self.interrupted.set = True
            recorder.rejudge()  # every trial's figures with every read
        if reads is not None:  # whether the reads were taken, and why (the report says it)
            self.state.reference_reads = reads.note()

    def remeasure(self, runner) -> None:
        """The best's loss parity checked late where its trial did not run it, the best re-measured against the
        baseline (a best the re-measurement rejects hands over to the next candidates: `checked.confirm_candidates`),
        within the time budget. Ctrl-C here keeps what is known."""
        records, search = self.recorder.records, self.plan.search
        self.baseline = self.recorder.baseline()
        self._late_speedups()
        self.ended, self.stopped, self.confirm = self.stop.reason or "interrupted", self._stopped(), None
        self.best = pick_best(records, self.plan.user_knobs)
        if self.stopped:
            return
        try:
            self.best, self.confirm, rejected = checked.confirm_candidates(
                records,
                self.baseline,
                lambda baseline, best: self._confirm(runner, baseline, best),
                lambda knobs, label: self._check(runner, knobs, label),
                self.tell.on_remeasure,
                min_improvement=search.min_improvement,
                budget_left=self.budget_left,
                user_knobs=self.plan.user_knobs,
            )
            if rejected:
                self.state.confirm_rejected = rejected
        except KeyboardInterrupt:  # Ctrl-C while checking or re-measuring: what is known is still exported
            self.stopped, self.ended, self.confirm = (
                "interrupted while checking and re-measuring the best",
                "interrupted",
                None,
            )
            self.best = pick_best(records, self.plan.user_knobs)

    def finish(self) -> SearchResult:
        """The verdicts (a best that did not beat the baseline in every pair ties with it), best_config.yaml, the
        summary, search.json and the parent run closed (its plots and last writes beside the backend's close)."""
        state, records, opened = self.state, self.recorder.records, self.opened
        self.recorder.write()  # late parity verdicts
        if self.confirm:
            state.confirm = self.confirm
        state.skipped_predicted = self.strategy.skipped_predicted()
        wall = self.elapsed()  # a resumed search counts all its runs
        result = SearchResult(
            self.run_dir,
            self.space,
            self.device,
            records,
            self.baseline,
            self.best,
            wall,
            opened.paths,
            self.stopped,
            self.ended,
            self.confirm,
            skipped=state.skipped_predicted,
            reads=self.recorder.reads,
            reads_note=state.reference_reads,
        )
        settle(result)
        summary = self._summary(result, wall)
        dataclasses.replace(state, wall_s=wall, stopped_reason=self.stopped, ended=self.ended).write(self.run_dir)
        opened.tracker.tag_search({"ended": self.ended})
        ok = any(r.throughput for r in records)

        def close() -> None:  # the plots (where matplotlib is installed), then the parent run closed with them
            plot_files = (
                plots.write_all(result, opened.storage_url, state.optuna_study)
                if ok and installed("matplotlib")
                else []
            )
            opened.tracker.finish(
                summary,
                [
                    opened.paths["best_config"],
                    opened.paths["trials_csv"],
                    self.run_dir / "spec.yaml",
                    SearchState.path(self.run_dir),
                ],
                status="FAILED" if self.stopped else "FINISHED",
                plots=plot_files,
                result=result,  # its answer on MLflow's first screen (tracking.Tracker.tell)
            )

        self.closing.append(close)
        return result

    def close(self) -> None:
        """The store let go where the search never adopted it, what `finish` left to close (the plots and MLflow's
        last writes, 1-2 s each) beside the backend's close, and the fork server. What failed there is raised."""
        tracking.adopt_store(self.store, None)  # not adopted (a check failed): removed
        with ThreadPoolExecutor(1) as pool:
            closed = [pool.submit(fn) for fn in self.closing]
            if self.backend_started is not None:
                self.backend.close(self.backend_started)
        if self.forks:
            self.forks.close()
        if not self.plan.search.keep_compile_cache:  # the winner's artifacts are beside best_config.yaml
            shutil.rmtree(compile_cache_of(self.run_dir), ignore_errors=True)
        for done in closed:
            done.result()

    # --- the clock ---------------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds this search has searched, a resumed search's earlier runs included."""
        return time.perf_counter() - self.started + (self.opened.wall_before if hasattr(self, "opened") else 0.0)

    def budget_left(self) -> float | None:
        """Seconds left of the time budget (None: no budget): the whole search's, the re-measurement's too."""
        budget = self.plan.search.time_budget_s
        return budget - self.elapsed() if budget else None

    def reserve(self) -> float:
        """Seconds kept aside at the budget's end for the re-measurement (autotune.decide.budget.remeasure_cost)."""
        search = self.plan.search
        return remeasure_cost(self.recorder.records, search.confirm_rounds, search.time_budget_s)

    def _watch(self, config: dict) -> dict:
        """What a trial's watch holds it to (autotune.decide.deadlines), as it is proposed: its first step and the
        gaps between its steps from what this search measured, and the budget's end, less the re-measurement's
        reserve (a trial still running there is cut; never the baseline)."""
        trial = self.plan.trial
        deadlines = Deadlines(trial.first_step_s, trial.stall_s, self.source.step_p95_ms(self.workload))
        left = self.budget_left()
        return deadlines.of_trial(
            {**self.space.baseline, **config},
            self.recorder.records,
            baseline=config.get("source") == "baseline",
            cut_unix=None if left is None else time.time() + left - self.reserve(),
        )

    # --- the steps of the phases -------------------------------------------------------------------------------

    def _given(self) -> dict:
        """The baseline's stated values: the spec's and the searched user arguments' own (checked: no two knobs
        that conflict)."""
        given = self.plan.given()
        given.update({K.USER_PREFIX + n: v for n, v in self.source.user_baseline().items()})
        clash = K.conflicts({**K.pytorch_defaults(None), **given})
        if clash:
            raise SpecError(f"baseline: {'; '.join(clash)}")
        return given

    def _build(self):
        """The workload built (or the program probed) while the backend starts, and an empty local MLflow store
        made to adopt (startup.prepare): (the workload, its optimizer's class). A local search's one fork server
        imports torch meanwhile (not with a Ray of the caller's own, whose nodes may be anywhere)."""
        plan = self.plan
        local_store = (
            not plan.tracking.uri
            and not self.options.resume
            and not (self.run_dir / "mlflow.db").exists()
            and installed("mlflow")
        )
        if self.backend.shares_forks(plan.resources):
            self.forks = start_shared(plan.workload.model_dump(mode="json"), self.user_path, user_thread_env())

        def build():
            return self.source.build(self.forks, self.started, self.tell.on_probe)

        with ThreadPoolExecutor(1) as pool:
            preparing = pool.submit(startup.prepare, build, run_dir=self.run_dir, local_store=local_store)
            self.backend_started = self.backend.start(plan.resources)
        workload, self.store, optimizer = preparing.result()
        return workload, optimizer

    def _space(self, workload) -> K.Space:
        """The space this device and workload resolve to, from the baseline (PyTorch's defaults, the workload's own
        values, the spec's), less what the workload cannot take."""
        plan, device, source = self.plan, self.device, self.source
        own = source.own(workload)
        accumulation = int(own.pop(K.ACCUMULATION, None) or 1)  # a program's own: its effective batch's other factor
        baseline = {**K.pytorch_defaults(workload.batch_size), **own, **self.given}
        lists, dropped = source.lists(plan.space.lists(), baseline, workload)
        resources = plan.resources
        why = SP.problem(resources.rank_placement, device) or source.problem(device, workload, lists, baseline)
        why = why or K.asked(plan.space.knobs.given(), device)  # a language model's knob asked for must run
        if why:
            raise SpecError(why)
        source.settle_baseline(baseline, own, device, self.given)
        safety = plan.safety
        space = K.resolve_space(
            lists,
            baseline,
            device,
            LEVELS[safety.level],
            keep_effective_batch=safety.keep_effective_batch,
            user=plan.space.user(),
            accumulation=accumulation,
        )
        space.dropped += dropped
        source.settle_space(space, workload)
        if not space.search:
            raise SpecError(space.nothing_to_search())
        if self.state and self.state.space["search"] != space.search:
            raise SpecError(
                f"`{self.run_dir}` searched {self.state.space['search']}; this machine resolves the space to "
                f"{space.search}: resume on the same kind of device"
            )
        return space

    def _settings(self) -> RunSettings:
        plan, space = self.plan, self.space
        base_knobs = {k: v for k, v in space.baseline.items() if k in K.KNOBS}
        parity = {
            # the baseline's parity reference: computed by the first trial that needs it, then reused
            "baseline": base_knobs,
            "steps": plan.safety.parity_steps,
            "tolerance": plan.safety.tolerance,
            "reference": str(self.run_dir / REFERENCE_FILE),
        }
        request = plan.trial_settings(
            self.device.type,
            space.baseline,
            accumulation=space.accumulation,
            parity=parity,
            flops_cache=str(self.run_dir / FLOPS_FILE),
            pickled=self.source.pickled,  # trials load the run dir's workload.pkl (bytes below for other nodes)
        )
        return self.backend.placed(
            RunSettings(
                request=request,
                timeout_s=plan.trial.timeout_s,
                first_step_s=plan.trial.first_step_s,  # the baseline's and a re-measurement's first step in time
                stall_s=plan.trial.stall_s,
                run_dir=str(self.run_dir),
                user_path=self.user_path,
                thread_env=user_thread_env(),  # Ray sets OMP_NUM_THREADS in its workers; a trial runs the user's
                workload_pickle=self.source.pickled,
                rank_placement=plan.resources.rank_placement,
                fork_socket=self.forks.path if self.forks else None,  # a local search's shared fork server
                compile_cache=str(compile_cache_of(self.run_dir)),  # its trials' one inductor and Triton cache
            )
        )

    def _reads(self) -> Reads | None:
        """The baseline read again between trials (autotune.decide.reference), where trials run one at a time
        here and the spec gives the reads a share of the search."""
        search = self.plan.search
        reader = self.backend.reader(
            self.settings,
            cuda=self.device.type == "cuda",
            target_ci=read_ci(self.plan.trial.target_ci, self.device.type),
        )
        if not reader or not search.reference_share:
            return None
        return Reads(
            self.study,
            self.strategy,
            self.recorder,
            reader,
            dict(self.space.baseline),
            started=time.time() - (time.perf_counter() - self.started) - self.opened.wall_before,
            device=self.device.type,
            when=(search.reference_share, search.reference_reads),
        )

    def _confirm(self, runner, baseline: TrialRecord | None, best: TrialRecord | None) -> dict | None:
        """The best re-measured against the baseline, side by side, each pair's windows sized by the gap, its pairs
        checked against the search's reads of the baseline and taken again, spaced, where they disagree
        (autotune.decide.confirm)."""
        need = max(
            (self.reservation(r.knobs) for r in (baseline, best) if r), key=lambda r: (r["CPU"], r["GPU"]), default={}
        )
        ci = window_ci(baseline, best, self.plan.trial.target_ci)
        search = self.plan.search
        against = (
            SearchReads.of(baseline, self.recorder.reads, self.device.type, search.confirm_spacing_s)
            if baseline and baseline.throughput
            else None
        )
        run = runner(need, target_ci=ci)
        if self.remeasured:  # the next candidate after a rejected best: its pairs beside the rejected one's, kept
            run = partial(labelled, run, f"{NEXT}{self.remeasured}-")
        self.remeasured += 1
        return confirm_best(
            run, baseline, best, search.confirm_rounds, self.tell.on_remeasure, self.budget_left, against=against
        )

    def _check(self, runner, knobs: dict, label: str) -> TrialResult:
        """A late loss-parity check (autotune.decide.checked), as the workload's source runs one."""
        context = {
            "baseline": self.space.baseline,
            "parity": self.settings.request.parity,
            "device_type": self.device.type,
            "run_dir": self.run_dir,
            "seed": self.plan.search.seed,
        }
        return self.source.check(runner, self.reservation, knobs, label, context)

    def _late_speedups(self) -> None:
        """Speedups of the trials that finished before the baseline did."""
        baseline, tracker = self.baseline, self.opened.tracker
        if not (baseline and baseline.throughput):
            return
        for r in self.recorder.records:
            if r.throughput and r.speedup is None and same_device(baseline, r):
                r.add_derived(speedup_x=r.throughput / baseline.throughput)
                tracker.log_metrics(r.mlflow_run_id, {"speedup_x": r.speedup})
        self.recorder.write()

    def _stopped(self) -> str | None:
        """Why the search stopped short of an answer (None: it did not)."""
        if self.recorder.baseline_failed:
            b = self.baseline
            return f"the baseline failed ({b.error_type}: {b.error}); nothing can be compared"
        if (self.stop.reason or "interrupted") == "interrupted":
            n = len(self.recorder.records)
            return f"interrupted after {n} of {self.opened.n_trials} trials; continue with `autotune search --resume {self.run_dir}`"
        return None

    def _summary(self, result: SearchResult, wall: float) -> dict:
        """The parent run's summary metrics; best_config.yaml written where there is a best to compare."""
        plan, records, best, baseline = self.plan, self.recorder.records, result.best, self.baseline
        ok = [r for r in records if r.throughput]
        summary = {"search_wall_s": wall, "trials": len(records), "trials_ok": len(ok), **pruning_savings(records)}
        compiled = [r.metrics["compile_s"] for r in records if r.metrics.get("compile_s")]
        if compiled:  # what compile cost the search, its trials sharing one cache (MLflow's parent run)
            summary["compile_s_total"] = sum(compiled)
        if result.reads_share:  # what the reference reads cost (autotune.decide.reference)
            summary.update(
                {f"reads_{k}" if k == "share" else k: v for k, v in result.reads_share.items() if v is not None}
            )
        if not (baseline and baseline.throughput and best):
            return summary
        export.write_best_config(
            result, self.opened.paths["best_config"], export.ExportSettings.of(plan), program=self.state.program
        )
        # the claim (its speedup, the search's own figure of the best, the pairs' count and range)
        summary.update(
            {result.unit.key("baseline"): baseline.throughput, result.unit.key("best"): best.throughput},
            **result.claim_metrics,
        )
        return summary


def run(
    spec: Spec,
    *,
    backend="auto",
    callbacks: Iterable[SearchCallback] = (),
    resume: bool = False,
    refresh: bool = False,
    factory: Callable | None = None,
) -> SearchResult:
    """A search of `spec` run to its end (`Search`)."""
    options = Options(resume=resume, refresh=refresh, factory=factory)
    return Search(spec, backend=backend, callbacks=callbacks, options=options).run()
