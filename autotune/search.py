"""The search: `autotune.strategy` chooses, on an Optuna study (RDB storage in the
run dir, resumable); Ray Tune places and runs each trial (on this host or any node
of a cluster); each trial runs in a fresh process (`python -m autotune.trial`).

Why a fresh process per trial: knobs such as cudnn.benchmark, compile caches and
the CUDA allocator are process state, and a reused process would carry them from
one trial into the next. The Ray actor is the trial's resource reservation; the
child process is its clean room, killed with its loader workers on timeout.

Only the driver writes MLflow, the Optuna storage, trials.csv and best_config.yaml,
as each trial's result arrives (a Ray Tune callback), so what finished is on disk
at once; a trial on another node sends its files back with its result.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import math
import os
import shutil
import signal
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import optuna

# Ray reads this when it is imported (DESIGN.md facts): set before `import ray`, the
# local node's address is 127.0.0.1 and every Ray server binds there, so a local
# search is not reachable from the network. `_init_ray` opens it again only for an
# explicit cluster address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray import tune  # noqa: E402
from ray.tune.search import Searcher  # noqa: E402

from autotune import export, plots, tracking
from autotune import knobs as K
from autotune import workload as W
from autotune.lock import device_lock
from autotune.request import TrialSettings
from autotune.records import (INFO, METRIC, STATE_FILE, SearchResult, TrialRecord, pick_best, pruning_savings,
                              read_run, same_device, write_csv, write_state)
from autotune.launcher import THREAD_ENV, run_in_process
from autotune.safety import LEVELS, REFERENCE_FILE
from autotune.strategy import Strategy, budget_fits, no_improvement_for
from autotune.spec import Spec, SpecError


# --- the trial, inside a Ray worker ---------------------------------------------


def _run_trial_in(config: dict, settings: dict, trial_dir: Path) -> dict:
    """The trial config for this Ray config (the one request builder), run in a fresh process."""
    request = settings["request"].config(config, config.get("prune_below"))
    return run_in_process(request, trial_dir, settings["timeout_s"], settings["user_cwd"], settings["thread_env"])


def flat_result(number: int, trial_dir: Path, result: dict) -> dict:
    """A trial's result.json as the flat dict Ray Tune carries to the driver."""
    flat = {
        "trial_number": number,
        "status": result.get("status", "error"),
        "error_type": result.get("error_type"),
        "error": result.get("error"),
        "trial_dir": str(trial_dir),
        "host": result.get("host"),
        "device_type": (result.get("device") or {}).get("type"),
        "device_name": (result.get("device") or {}).get("name"),
        "torch": result.get("torch"),
        "trial_wall_s": result.get("trial_wall_s", result.get("trial_s", 0.0)),
        "diagnosis_json": json.dumps(result["diagnosis"]) if result.get("diagnosis") else None,
        "parity_json": json.dumps(result["parity"]) if result.get("parity") else None,
        "optimizer": result.get("optimizer"),
        "has_batchnorm": result.get("has_batchnorm"),
        **{f"m/{k}": v for k, v in (result.get("metrics") or {}).items()},
    }
    if flat["status"] == "ok":
        flat[METRIC] = result["metrics"][METRIC]
    return flat


def _trainable(config: dict, settings: dict) -> None:
    """Ray Tune's function trainable: one trial process, one report. Never
    raises: whatever goes wrong is reported as the trial's error. On the
    driver's node the trial writes its dir in the run dir; on another node it
    runs in a temporary dir whose files travel back in the report."""
    import tempfile

    import ray

    number = config["trial_number"]
    trial_dir = Path(settings["run_dir"]) / "trials" / f"{number:04d}"
    started = time.time()
    remote = ray.get_runtime_context().get_node_id() != settings["driver_node"]
    work_dir = Path(tempfile.mkdtemp(prefix=f"autotune-trial-{number:04d}-")) if remote else trial_dir
    try:
        result = _run_trial_in(config, settings, work_dir)
    except Exception as e:
        result = {"status": "error", "error_type": type(e).__name__, "error": str(e), "trial_wall_s": 0.0}
    flat = flat_result(number, trial_dir, result)
    flat.update(node_ip=ray.util.get_node_ip_address(), gpu_ids=",".join(map(str, ray.get_gpu_ids())) or None,
                started_unix=started, ended_unix=time.time())
    if remote:
        flat["files_b64"] = pack_dir(work_dir)
        shutil.rmtree(work_dir, ignore_errors=True)
    tune.report(flat)


def pack_dir(path: Path) -> str:
    """A trial dir as base64 tar.gz text (Tune carries results as data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(path.iterdir()):
            if f.is_file():
                tar.add(f, arcname=f.name)
    return base64.b64encode(buf.getvalue()).decode()


def unpack_dir(data: str, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as tar:
        tar.extractall(path, filter="data")


class _Searcher(Searcher):
    """Ray Tune's view of `autotune.strategy.Strategy`: each suggestion is the
    strategy's next proposal (an Optuna trial in the run dir's storage), each
    finished trial is told back with its status. The study holds all state, so
    save/restore have nothing to add."""

    def __init__(self, strategy: Strategy, fixed: dict, prune_margin: float, fits: Callable[[dict], bool]):
        super().__init__(metric=METRIC, mode="max")
        self.strategy, self.fixed, self.prune_margin, self.fits = strategy, fixed, prune_margin, fits
        self.live: dict[str, tuple[optuna.trial.Trial, str]] = {}  # Ray trial id -> Optuna trial, source
        self.exhausted = False  # every point measured, or known infeasible / over the budget

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        proposal = self.strategy.ask(self.fits)
        if proposal is None:
            self.exhausted = True
            return Searcher.FINISHED
        self.live[trial_id] = proposal.trial, proposal.source
        return {**self.fixed, **proposal.params, "trial_number": proposal.trial.number, "source": proposal.source,
                "prune_below": self.strategy.prune_below(self.prune_margin)}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        trial, _ = self.live.pop(trial_id)
        result = result or {}
        parity = json.loads(result.get("parity_json") or "null")
        diagnosis = json.loads(result.get("diagnosis_json") or "null")
        self.strategy.tell(
            trial, "error" if error else result.get("status", "error"), result.get("m/samples_per_s"),
            safe=parity is None or bool(parity.get("passed")),
            error=f"{result.get('error_type')}: {result['error']}" if result.get("error") else None,
            diagnosis=diagnosis,  # every trial's: the strategy moves from each incumbent's own bottleneck
        )

    def save(self, checkpoint_path: str) -> None:
        pass

    def __getstate__(self):  # lives in the driver (its `fits` reads the driver's records)
        return {}

    def restore(self, checkpoint_path: str) -> None:
        pass


# --- the driver -------------------------------------------------------------------


def _detect_device(spec: Spec) -> K.Device:
    """The device trials will run on, and the CPUs of the largest node."""
    import ray

    cpus = int(max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=os.cpu_count() or 1))
    gpus = ray.cluster_resources().get("GPU", 0)
    if spec.resources.device == "cpu" or (spec.resources.device == "auto" and gpus == 0):
        return K.Device("cpu", cpus, "cpu")
    if gpus == 0:
        raise SpecError("resources.device: `cuda` requested but the Ray cluster has no GPU")

    @ray.remote(num_gpus=1, num_cpus=0)
    def probe():
        import torch

        return torch.cuda.get_device_name(), tuple(torch.cuda.get_device_capability())

    name, capability = ray.get(probe.remote())
    return K.Device("cuda", cpus, name, capability)


def _init_ray(address: str | None) -> bool:
    """Connect to `address`, or start a local Ray bound to 127.0.0.1. Returns
    whether this call started Ray (and so should stop it). A local Ray that
    would not be on loopback is refused, not started."""
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # autotune prints its own table
    # Ray decides its node address from this flag (read at import from
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, set above): off, everything binds 127.0.0.1.
    # A cluster is the user's explicit choice, and keeps Ray's token auth unless
    # the user turns it off (RAY_AUTH_MODE=disabled).
    ray_constants.ENABLE_RAY_CLUSTER = address is not None
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # nothing off this host can reach it
    # a cluster on loopback addresses runs on this machine: join it from its head's address
    host = address.rsplit(":", 1)[0] if address and address not in ("auto", "local") else None
    node_ip = {"_node_ip_address": host} if host and host.startswith("127.") else {}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", **node_ip)
    if address is None and not ray.util.get_node_ip_address().startswith("127."):
        ray.shutdown()
        raise SpecError(f"the local Ray came up on {ray.util.get_node_ip_address()}, not 127.0.0.1; refusing to "
                        "run a search reachable from the network (is RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 set?)")
    return True


def _stop_on_sigterm() -> None:
    """SIGTERM stops a search the way Ctrl-C does: Ray Tune stops the running
    trial, everything finished is already written, `--resume` continues. Set
    after ray.init, whose core worker installs a handler of its own."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


class _Recorder:
    """Ray Tune callback: turns each finished trial into a record, writes it
    everywhere at once, and tells the caller."""

    def __init__(self, tracker, records, csv_path, on_trial, baseline_knobs):
        self.tracker, self.records, self.baseline_knobs = tracker, records, baseline_knobs
        self.csv_path, self.on_trial = csv_path, on_trial
        self.on_trial_start: Callable | None = None
        self.baseline_failed: TrialRecord | None = None

    def baseline(self) -> TrialRecord | None:
        return next((r for r in self.records if r.is_baseline), None)

    def add(self, config: dict, result: dict | None, ray_error: str | None = None) -> None:
        result = dict(result or {})
        if result.get("files_b64"):  # a trial from another node: its files, into the run dir
            unpack_dir(result.pop("files_b64"), Path(result["trial_dir"]))
        knobs = {k: config[k] for k in self.baseline_knobs}  # the built-in knobs and the user's
        status = result.get("status") or "error"
        record = TrialRecord(
            number=config["trial_number"],
            status=status,
            knobs=knobs,
            metrics={k[2:]: v for k, v in result.items() if k.startswith("m/") and v is not None},
            # the baseline is enqueued first; a later trial with its knobs is a repeat
            is_baseline=knobs == self.baseline_knobs and self.baseline() is None,
            error_type=result.get("error_type") or ("RayTrialError" if ray_error else None),
            error=result.get("error") or ray_error,
            trial_dir=result.get("trial_dir"),
            info={k: result.get(k) for k in INFO if result.get(k) is not None},
            diagnosis=json.loads(result.get("diagnosis_json") or "null"),
            parity=json.loads(result.get("parity_json") or "null"),
        )
        base = self.baseline()
        if record.is_baseline:
            base = record
            if status != "ok":
                self.baseline_failed = record
        if base and base.throughput and record.measured and same_device(base, record):  # a pruned trial's too
            record.metrics["speedup_x"] = record.measured / base.throughput
        self.records.append(record)
        record.mlflow_run_id = self.tracker.log_trial(record, self.baseline_knobs)
        write_csv(self.records, self.csv_path)
        if self.on_trial:
            self.on_trial(record)


class _DriverOnly:
    """Ray pickles callbacks and stoppers into its experiment state; the recorder
    (live view, MLflow client) lives in the driver only and is left out."""

    def __init__(self, recorder: _Recorder):
        self.recorder = recorder

    def __getstate__(self):
        return {}


class _RecordTrials(_DriverOnly, tune.Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        if self.recorder.on_trial_start:  # the live view's row for the running trial
            self.recorder.on_trial_start(trial.config["trial_number"], {k: trial.config[k] for k in K.KNOBS})

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.recorder.add(trial.config, trial.last_result)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = trial.get_pickled_error()
        self.recorder.add(trial.config, trial.last_result, ray_error=str(error or "the Ray trial failed"))


class _Stop(_DriverOnly, tune.Stopper):
    """Stop the search when the baseline failed, or when `patience` trials in a
    row improved the best by no more than `min_improvement`."""

    def __init__(self, recorder: _Recorder, patience: int | None, min_improvement: float):
        super().__init__(recorder)
        self.patience, self.min_improvement = patience, min_improvement

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        return self.recorder.baseline_failed is not None or self.stalled()

    def stalled(self) -> bool:
        return bool(self.patience) and no_improvement_for(
            [r.throughput if r.safe else None for r in self.recorder.records], self.min_improvement) >= self.patience


def run(spec: Spec, on_start: Callable | None = None, on_trial: Callable | None = None,
        resume: bool = False, on_trial_start: Callable | None = None,
        on_wait: Callable[[str], None] | None = None) -> SearchResult:
    """Run a search to its end (trial count, time budget, a failed baseline, or
    Ctrl-C / SIGTERM). With `resume`, continue the search in `spec.output_dir`
    from its Optuna storage: finished trials are neither lost nor repeated.
    Everything that can be checked is checked before anything is written. A
    local search waits while another one measures on the same device (`on_wait`
    hears why)."""
    started = time.perf_counter()
    run_dir = spec.resolved_output_dir().resolve()
    state = None
    if resume:
        if not (run_dir / STATE_FILE).exists():
            raise SpecError(f"`{run_dir}` is not a search's output dir (no {STATE_FILE}); nothing to resume")
        state = json.loads((run_dir / STATE_FILE).read_text())
    user_cwd = os.getcwd()
    if user_cwd not in sys.path:
        sys.path.insert(0, user_cwd)  # user factories resolve as the trials will resolve them
    user = spec.search_space.user()
    try:  # what needs no torch is checked before anything starts
        user_base = W.user_knob_baseline(spec.workload.ref, spec.workload.args, user)
    except W.WorkloadError as e:
        raise SpecError(f"workload: {e}") from e
    given = {k: v for k, v in spec.baseline.model_dump().items() if v is not None}
    given.update({K.USER_PREFIX + n: v for n, v in user_base.items()})
    clash = K.conflicts({**K.pytorch_defaults(None), **given})
    if clash:
        raise SpecError(f"baseline: {'; '.join(clash)}")
    K.declare(user)
    if spec.tracking.uri:
        tracking.check_uri(spec.tracking.uri)
    from concurrent.futures import ThreadPoolExecutor

    local_store = not spec.tracking.uri and not resume and not (run_dir / "mlflow.db").exists()
    with ThreadPoolExecutor(1) as pool:  # start-up: the workload builds while Ray starts (see _prepare)
        preparing = pool.submit(_prepare, spec, run_dir, local_store)
        started_ray = _init_ray(spec.resources.ray_address)
    _stop_on_sigterm()
    store = None
    try:
        workload, store = preparing.result()
        baseline = {**K.pytorch_defaults(workload.batch_size), **given}
        lists, too_big = _fit_batches(spec.search_space.lists(), baseline["batch_size"], len(workload.dataset))
        device = _detect_device(spec)
        space = K.resolve_space(lists, baseline, device, LEVELS[spec.safety.level],
                                spec.safety.keep_effective_batch, user)
        space.dropped += too_big
        if not space.search:
            raise SpecError(
                "search_space: nothing to search on this device; every knob is fixed: "
                + "; ".join(f"{k} ({why})" for k, why in space.fixed.items())
            )
        if state and state["space"]["search"] != space.search:
            raise SpecError(f"`{run_dir}` searched {state['space']['search']}; this machine resolves the space to "
                            f"{space.search}: resume on the same kind of device")
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            (run_dir / "spec.yaml").write_text(_dump_yaml(spec.model_dump(mode="json")))
        tracking.adopt_store(store, run_dir)
        # a cluster's scheduler places trials; on this host, one search per device at a time
        lock = contextlib.nullcontext() if spec.resources.ray_address else device_lock(device.type, run_dir, on_wait)
        with lock as waited:
            started += waited or 0.0  # waiting is not searching (time budget, wall time)
            return _search(spec, run_dir, user_cwd, device, space, started, on_start, on_trial, state, on_trial_start)
    finally:
        tracking.adopt_store(store, None)  # not adopted (a check failed): removed
        if started_ray:
            import ray

            ray.shutdown()


def _fit_batches(lists: dict[str, list], base_batch: int, samples: int) -> tuple[dict[str, list], list[str]]:
    """Batch sizes larger than the dataset cannot make one batch: refused for the
    baseline, dropped from the space with the reason."""
    if base_batch > samples:
        raise SpecError(f"baseline: batch_size {base_batch} is larger than the workload's dataset ({samples} samples); "
                        "use a smaller batch or a larger dataset")
    batches = lists.get("batch_size", [])
    too_big = [f"batch_size={b}: larger than the dataset ({samples} samples)" for b in batches if b > samples]
    if batches:
        lists = {**lists, "batch_size": [b for b in batches if b <= samples]}
    return lists, too_big


def _prepare(spec: Spec, run_dir: Path, local_store: bool) -> tuple[W.Workload, Path | None]:
    """The user's workload, checked (imports torch and the factory), and an
    empty local MLflow store to adopt (`tracking.empty_store`, which imports
    MLflow). Runs while Ray starts: on 2 shared cores (load ~3) the first trial
    of the quickstart started after 7.6-10.7 s instead of 10.5-13.6 s."""
    try:
        workload = W.load(spec.workload.ref, spec.workload.args)
    except W.WorkloadError as e:
        raise SpecError(f"workload: {e}") from e
    try:
        return workload, tracking.empty_store(run_dir) if local_store else None
    except Exception:  # no head start: the Tracker creates the store itself
        return workload, None


def _reconcile(study, recorder: "_Recorder", space: K.Space, run_dir: Path) -> None:
    """After a crash or an interruption: trials Optuna saw finish but the driver
    did not record (killed in between) are recorded from their result.json;
    trials left RUNNING are marked FAIL and `interrupted` (the strategy proposes
    them again first)."""
    from optuna.trial import TrialState

    recorded = {r.number for r in recorder.records}
    fixed = {k: v for k, v in space.baseline.items() if k not in space.search}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("virtual"):
            continue  # never ran: a repeat or a predicted failure told to the sampler
        result_file = run_dir / "trials" / f"{t.number:04d}" / "result.json"
        finished = t.state in (TrialState.COMPLETE, TrialState.FAIL) and not t.user_attrs.get("interrupted")
        if finished and t.number not in recorded and result_file.exists():
            result = json.loads(result_file.read_text())
            recorder.add({**fixed, **t.params, "trial_number": t.number},
                         flat_result(t.number, result_file.parent, result))
        elif t.state == TrialState.RUNNING or (finished and t.number not in recorded):
            study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            if t.state == TrialState.RUNNING:
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)


@dataclasses.dataclass
class _Opened:
    tracker: tracking.Tracker
    paths: dict[str, Path]
    state: dict
    n_trials: int
    storage_url: str
    wall_before: float = 0.0  # seconds the search ran before this run of it (a resume)


def _open(spec, run_dir, device, space, state) -> _Opened:
    """The search's MLflow parent run and search.json: new, or reopened to resume."""
    storage_url = f"sqlite:///{run_dir / 'optuna.db'}"
    paths = {"run_dir": run_dir, "trials_csv": run_dir / "trials.csv", "best_config": run_dir / "best_config.yaml",
             "optuna_storage": run_dir / "optuna.db", "mlflow_uri": spec.tracking.uri or tracking.default_uri(run_dir)}
    if state:
        paths["mlflow_uri"] = state["mlflow_uri"]
    tracker = tracking.Tracker(str(paths["mlflow_uri"]), spec.tracking.experiment, run_dir, spec.name,
                               parent_run_id=state["mlflow_parent_run_id"] if state else None)
    if not state:
        tracker.log_search(
            params={**{f"baseline.{k}": v for k, v in space.baseline.items()},
                    **{f"space.{k}": json.dumps(v) for k, v in space.search.items()},
                    "workload": spec.workload.ref, "sampler": spec.search.sampler, "n_trials": spec.search.n_trials},
            tags={"device": f"{device.type}:{device.name}",
                  **{f"fixed.{k}": why for k, why in space.fixed.items()}},
        )
    n_trials = spec.search.n_trials
    if spec.search.sampler == "grid":
        n_trials = min(n_trials, math.prod(len(v) for v in space.search.values()))
    wall_before = 0.0
    if state:
        n_trials = state["n_trials"]
        wall_before = state.get("wall_s") or state.get("wall_before_s") or 0.0
        # until this run finishes, the time already spent stays on record (a kill loses nothing)
        state = {**{k: v for k, v in state.items() if k not in ("wall_s", "stopped_reason", "ended")},
                 "wall_before_s": wall_before}
        tracker.client.update_run(tracker.parent_run_id, status="RUNNING")
    else:
        state = {"name": spec.name, "device": dataclasses.asdict(device), "space": dataclasses.asdict(space),
                 "n_trials": n_trials, "time_budget_s": spec.search.time_budget_s, "mlflow_uri": str(paths["mlflow_uri"]),
                 "mlflow_experiment": spec.tracking.experiment, "mlflow_parent_run_id": tracker.parent_run_id,
                 "optuna_study": spec.name, "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return _Opened(tracker, paths, state, n_trials, storage_url, wall_before)


def _search(spec, run_dir, user_cwd, device, space, started, on_start, on_trial, state,
            on_trial_start=None) -> SearchResult:
    import ray

    cuda = device.type == "cuda"
    cpus_per_trial = spec.resources.cpus_per_trial
    gpus_per_trial = spec.resources.gpus_per_trial if spec.resources.gpus_per_trial is not None else (1 if cuda else 0)

    def cpus_fn(config) -> int:
        # Ray's reservation, not the trial's threads (those are torch's default or
        # the num_threads knob: what the user will run). With a GPU: the loader
        # workers + the main process; a CPU host runs one trial at a time
        if cpus_per_trial:
            return cpus_per_trial
        return min(config["num_workers"] + 1, device.cpus) if cuda else max(1, device.cpus - 1)

    # failed trials report no throughput; Optuna records them as FAIL (see _Searcher)
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    # Tune's own per-trial result files would duplicate trials.csv (and the trial
    # files that travel back from other nodes)
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opened = _open(spec, run_dir, device, space, state)
    tracker, paths, state, n_trials, storage_url = (opened.tracker, opened.paths, opened.state, opened.n_trials,
                                                    opened.storage_url)
    write_state(run_dir, state)
    records: list[TrialRecord] = read_run(run_dir).records if (run_dir / "trials.csv").exists() else []
    recorder = _Recorder(tracker, records, paths["trials_csv"], None, space.baseline)
    study = optuna.create_study(study_name=state["optuna_study"], storage=storage_url, direction="maximize",
                                load_if_exists=True, sampler=Strategy.make_sampler(spec.search.sampler, spec.search.seed))
    _reconcile(study, recorder, space, run_dir)  # interrupted trials are proposed again first
    recorder.on_trial, recorder.on_trial_start = on_trial, on_trial_start
    strategy = Strategy(study, space.search, space.baseline, spec.search.sampler, spec.search.min_improvement,
                        spec.search.seed, cuda=device.type == "cuda")
    remaining = n_trials - len(records)
    if on_start:
        on_start(device, space, run_dir, n_trials, spec.search.time_budget_s)
    for record in sorted(records, key=lambda r: r.number) if on_trial else ():
        on_trial(record)  # what an earlier run of this search finished

    base_knobs = {k: v for k, v in space.baseline.items() if k in K.KNOBS}
    settings = {
        "request": TrialSettings.of(spec.model_dump(mode="json"), device.type, space.baseline, parity={
            # the baseline's parity reference: computed by the first trial that needs it, then reused
            "baseline": base_knobs, "steps": spec.safety.parity_steps, "tolerance": spec.safety.tolerance,
            "reference": str(run_dir / REFERENCE_FILE)}),
        "timeout_s": spec.trial.timeout_s,
        "run_dir": str(run_dir), "user_cwd": user_cwd,
        # Ray sets OMP_NUM_THREADS in its workers; a trial runs with the user's own
        "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
        "driver_node": ray.get_runtime_context().get_node_id(),
    }
    budget = spec.search.time_budget_s

    affordable = budget_fits(records, space.baseline, budget, started)  # the compile modes the budget affords

    def fits(params: dict) -> bool:
        """Can this config run: no two knobs in conflict (prefetch_factor without
        workers), and within the time budget."""
        return not space.conflicts(params) and affordable(params)

    searcher = _Searcher(strategy, {k: v for k, v in space.baseline.items() if k not in space.search},
                         spec.trial.prune_margin, fits)
    stopper = _Stop(recorder, None if spec.search.sampler == "grid" else spec.search.patience,
                    spec.search.min_improvement)
    custom = spec.resources.custom
    trainable = tune.with_resources(
        tune.with_parameters(_trainable, settings=settings),
        lambda config: tune.PlacementGroupFactory([{"CPU": cpus_fn(config), "GPU": gpus_per_trial, **custom}]),
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=max(remaining, 1),
            # a local CPU host runs one trial at a time (two at once disturb each
            # other's numbers); GPUs and cluster nodes are placed by resources
            max_concurrent_trials=None if cuda or spec.resources.ray_address else 1,
            time_budget_s=spec.search.time_budget_s,
            # the Ray actor only reserves resources and starts the trial process,
            # which is fresh every time: reusing actors saves ~3 s a trial and
            # carries no torch state from one trial to the next
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name="ray", storage_path=str(run_dir), verbose=0, callbacks=[_RecordTrials(recorder)],
            stop=stopper, failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    if remaining > 0:
        tuner.fit()

    return _finish(spec, run_dir, device, space, started, opened, recorder, stopper, searcher)


def _finish(spec, run_dir, device, space, started, opened: "_Opened", recorder: _Recorder, stopper: _Stop,
            searcher: _Searcher) -> SearchResult:
    """Speedups of trials that finished before the baseline, the best config,
    why the search ended, the plots, and the parent run closed."""
    tracker, paths, state, n_trials, records = opened.tracker, opened.paths, opened.state, opened.n_trials, recorder.records
    baseline = recorder.baseline()
    if baseline and baseline.throughput:  # trials that finished before the baseline did
        for r in records:
            if r.throughput and r.speedup is None and same_device(baseline, r):
                r.metrics["speedup_x"] = r.throughput / baseline.throughput
                tracker.log_metrics(r.mlflow_run_id, {"speedup_x": r.speedup})
        write_csv(records, paths["trials_csv"])
    ok = [r for r in records if r.throughput]
    best = pick_best(records)
    stopped = None
    wall = time.perf_counter() - started + opened.wall_before  # a resumed search counts all its runs
    budget = spec.search.time_budget_s
    if recorder.baseline_failed:
        stopped = f"the baseline failed ({baseline.error_type}: {baseline.error}); nothing can be compared"
    elif len(records) < n_trials and not (budget and wall >= budget) and not stopper.stalled() and not searcher.exhausted:
        stopped = (f"interrupted after {len(records)} of {n_trials} trials; "
                   f"continue with `autotune search --resume {run_dir}`")
    ended = ("the baseline failed" if recorder.baseline_failed else stopped and "interrupted"
             or (stopper.stalled() and f"no gain above {spec.search.min_improvement:.0%} in "
                                       f"{spec.search.patience} trials")
             or (searcher.exhausted and "every point of the space measured or known infeasible")
             or (len(records) >= n_trials and f"{n_trials} trials") or "the time budget")
    result = SearchResult(run_dir, space, device, records, baseline, best, wall, paths, stopped, ended)
    summary = {"search_wall_s": wall, "trials": len(records), "trials_ok": len(ok), **pruning_savings(records)}
    if baseline and baseline.throughput and best:
        export.write_best_config(result, spec, paths["best_config"])
        summary.update(baseline_samples_per_s=baseline.throughput, best_samples_per_s=best.throughput,
                       speedup_x=best.throughput / baseline.throughput)
    write_state(run_dir, {**state, "wall_s": wall, "stopped_reason": stopped, "ended": ended})
    tracker.tag_search({"ended": ended})
    paths["plots"] = run_dir / "plots"
    plot_files = plots.write_all(result, opened.storage_url, state["optuna_study"]) if ok else []
    tracker.finish(summary, [paths["best_config"], paths["trials_csv"], run_dir / "spec.yaml", run_dir / "search.json"],
                   status="FAILED" if stopped else "FINISHED", plots=plot_files)
    return result


def _dump_yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
