"""The Ray adapter: a local Ray bound to loopback (or a cluster), the trial as a
Ray Tune function trainable (a fresh trial process per trial, its files carried
back from other nodes), `autotune.decide.strategy.Strategy` as a Tune searcher, and the
driver-side callbacks (recording, stopping).

Only the driver writes MLflow, the Optuna storage, trials.csv and best_config.yaml
(`autotune.records.recorder`), as each trial's result arrives.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import signal
import tarfile
import time
from pathlib import Path

# Ray reads this when it is imported (docs/design.md, the facts): set before `import ray`, the
# local node's address is 127.0.0.1 and every Ray server binds there, so a local
# search is not reachable from the network. `init_ray` opens it again only for an
# explicit cluster address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray import tune  # noqa: E402
from ray.tune.search import Searcher as TuneSearcher  # noqa: E402

from autotune import knobs as K  # noqa: E402
from autotune.decide.stoppers import Budget, Combined  # noqa: E402
from autotune.execution import reaper  # noqa: E402
from autotune.execution.proposer import Proposer, knobs_of, stop_on_sigterm  # noqa: E402
from autotune.execution.spread import placement, rank_bundles, spreads  # noqa: E402
from autotune.execution.trials import reader, run_trial  # noqa: E402
from autotune.execution.protocol import TrialRun  # noqa: E402
from autotune.execution.settings import RunSettings  # noqa: E402
from autotune.records.run_dir import TUNE_METRIC, result_of, transport, trial_dir_of  # noqa: E402
from autotune.spec import Resources, SpecError  # noqa: E402
from autotune.trial.result import TrialResult  # noqa: E402
from autotune.workload import PICKLE_FILE  # noqa: E402

# --- the trial, inside a Ray worker ---------------------------------------------


def run_on_node(config: dict, settings: RunSettings, local_dir: Path) -> tuple[TrialResult, str | None]:
    """Run the trial where Ray placed this call. Never raises: whatever goes
    wrong is the trial's error. On the driver's node the trial writes
    `local_dir`; on another node a temporary copy of the run dir's layout (with
    the pickled factory, which travels in `settings`), whose trial files travel
    back packed (the second item; None on the driver's node)."""
    import tempfile

    import ray

    remote = ray.get_runtime_context().get_node_id() != settings.driver_node
    root = Path(tempfile.mkdtemp(prefix=f"autotune-{local_dir.name}-")) if remote else None
    # the run dir's last two levels (trials/NNNN, confirm/LABEL): a trial config's relative `file` finds the factory
    work_dir = root / local_dir.parent.name / local_dir.name if remote else local_dir
    if remote and settings.workload_pickle:
        (root / PICKLE_FILE).write_bytes(settings.workload_pickle)
    if remote:  # the search's compile cache is on the driver's node: a trial here keeps its own
        settings = settings.placed(compile_cache=None)
    result = run_trial(config, settings, work_dir)
    if not remote:
        return result, None
    packed = pack_dir(work_dir)
    shutil.rmtree(root, ignore_errors=True)
    return result, packed


def trainable(config: dict, settings: RunSettings) -> None:
    """Ray Tune's function trainable: one trial process, one report."""
    import ray

    number = config["trial_number"]
    trial_dir = trial_dir_of(settings.run_dir, number)
    started = time.time()
    result, packed = run_on_node(config, settings, trial_dir)
    flat = transport(number, trial_dir, result)
    flat.update(
        node_ip=ray.util.get_node_ip_address(),
        gpu_ids=",".join(map(str, ray.get_gpu_ids())) or None,
        started_unix=started,
        ended_unix=time.time(),
    )
    if packed:
        flat["files_b64"] = packed
    tune.report(flat)


class _Remeasurer:
    """A Ray actor holding one trial's reservation while configs are measured
    again or checked late (autotune.decide.confirm, autotune.decide.checked); its fork server
    stays warm from one run to the next."""

    def run(self, knobs: dict, label: str, settings: RunSettings) -> tuple[dict, str | None]:
        return run_on_node(knobs, settings, Path(settings.run_dir) / "confirm" / label)


@contextlib.contextmanager
def remeasurers(settings: RunSettings, local: bool = False):
    """`runner(resources, parity_only=False, target_ci=None, noise=None)` ->
    `run(knobs, label) -> result`, through Ray, for the block (the search's
    end: late parity checks, each candidate's re-measurement): each run placed
    like a trial (`resources`), with the trial settings less profiling,
    diagnosis and parity, windows to `target_ci` where given (`parity_only`:
    loss parity alone, the late check of `autotune.decide.checked`). One actor runs
    them all while the reservation stays the same (a fresh actor and fork
    server cost 4-8 s on 2 loaded cores, per check or re-measurement); a
    different one replaces it, never beside it (one GPU cannot hold two).
    `local`: the driver's own Ray on this host, whose trials have ended, so
    nothing else can hold the device: the driver runs them itself, through the
    search's shared fork server (no actor, no second server: ~5 s on 2 cores)."""
    import ray

    held: dict = {}  # the one actor: {"key": its resources, "actor": ...}

    def runner(resources: dict, parity_only: bool = False, target_ci: float | None = None, noise=None):
        request, again = settings.request, settings.again(parity_only=parity_only, target_ci=target_ci, noise=noise)
        if spreads(settings.rank_placement, request.ranks):  # the actor holds nothing; the ranks' group does
            again, resources = again.placed(rank_bundles=rank_bundles(resources, request.ranks)), {"CPU": 0}
        key = json.dumps(resources, sort_keys=True)

        def run(knobs: dict, label: str) -> dict:
            if local:
                return run_on_node(knobs, again, Path(settings.run_dir) / "confirm" / label)[0]
            if held.get("key") != key:  # started by the first run: none when there is nothing to re-measure
                if held:
                    ray.kill(held["actor"])
                held.update(
                    key=key,
                    actor=ray.remote(_Remeasurer)
                    .options(
                        num_cpus=resources.get("CPU", 1),
                        num_gpus=resources.get("GPU", 0),
                        resources={k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
                    )
                    .remote(),
                )
            result, packed = ray.get(held["actor"].run.remote(knobs, label, again))
            if packed:
                unpack_dir(packed, Path(settings.run_dir) / "confirm" / label)
            return result

        return run

    try:
        yield runner
    finally:
        if held:
            ray.kill(held["actor"])


def pack_dir(path: Path) -> str:
    """A trial dir as base64 tar.gz text (Tune carries results as data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(path.iterdir()):
            if f.is_file() or f.is_dir():  # a dir: the scaling reference's (autotune.records.scaling)
                tar.add(f, arcname=f.name)
    return base64.b64encode(buf.getvalue()).decode()


def unpack_dir(data: str, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as tar:
        tar.extractall(path, filter="data")


# --- the search, in the driver ---------------------------------------------------


class Searcher(TuneSearcher):
    """Ray Tune's view of the strategy (`proposer.Proposer`): each suggestion is the
    strategy's next proposal, none once the search's stoppers say stop (`stop`: the time
    budget among them, which ends no running trial: each is cut by its own watch).
    Each finished trial is told back where its result lands,
    parsed once (`RecordTrials`: Ray Tune asks this searcher first, then the callbacks,
    in the same call). The study holds all state, so save/restore have nothing to add."""

    def __init__(self, proposer: Proposer, stop: Combined):
        super().__init__(metric=TUNE_METRIC, mode="max")
        self.proposer, self.stop = proposer, stop

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        if self.stop.stop():
            return TuneSearcher.FINISHED
        config = self.proposer.suggest(trial_id)
        return TuneSearcher.FINISHED if config is None else config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass  # told by RecordTrials, with the result it parses

    def save(self, checkpoint_path: str) -> None:
        pass

    def __getstate__(self):  # lives in the driver (its `fits` reads the driver's records)
        return {}

    def restore(self, checkpoint_path: str) -> None:
        pass


def detect_device(resources: Resources) -> K.Device:
    """The device trials will run on, and the CPUs of the largest node."""
    import ray

    cpus = int(max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=os.cpu_count() or 1))
    gpus = ray.cluster_resources().get("GPU", 0)
    if resources.device == "cpu" or (resources.device == "auto" and gpus == 0):
        return K.Device("cpu", cpus, "cpu")
    if gpus == 0:
        raise SpecError("resources.device: `cuda` requested but the Ray cluster has no GPU")

    @ray.remote(num_gpus=1, num_cpus=0)
    def probe():
        import torch

        return torch.cuda.get_device_name(), tuple(torch.cuda.get_device_capability())

    name, capability = ray.get(probe.remote())
    return K.Device("cuda", cpus, name, capability)


def init_ray(address: str | None) -> bool:
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
        # Ray's sockets live under $TMPDIR/ray; a relative TMPDIR gives the raylet a socket path it parses as a
        # TCP address: it aborts, and ray.init waits 30 s to say "the node timed out during startup"
        if os.environ.get("TMPDIR") and not os.path.isabs(os.environ["TMPDIR"]):
            os.environ["TMPDIR"] = os.path.abspath(os.environ["TMPDIR"])
        # no idle worker per CPU started with the driver: a search starts its one actor itself
        # (scripts/bench/bench_ray_start.py: init + first actor 6.8 s against 9.1 s, 2 loaded cores)
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    # a cluster on loopback addresses runs on this machine: join it from its head's address
    host = address.rsplit(":", 1)[0] if address and address not in ("auto", "local") else None
    node_ip = {"_node_ip_address": host} if host and host.startswith("127.") else {}
    global _reaper
    if address is None:  # a local Ray is this process's: it ends with it, a kill -9 included
        _reaper = reaper.start()
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", **node_ip)
    if address is None and not ray.util.get_node_ip_address().startswith("127."):
        shutdown_ray()
        raise SpecError(
            f"the local Ray came up on {ray.util.get_node_ip_address()}, not 127.0.0.1; refusing to "
            "run a search reachable from the network (is RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 set?)"
        )
    return True


_reaper = None  # autotune.execution.reaper's process while a local Ray started by `init_ray` runs


def warm_worker() -> None:
    """Start one Ray worker now and load this module in it (Ray Tune, Optuna): a
    local Ray starts none with the driver (init_ray), and Ray Tune's first trial
    actor takes this idle one instead of starting its own while the driver opens
    the study and the MLflow run."""
    import ray

    ray.remote(num_cpus=0)(_loaded).remote()


def _loaded() -> None:
    """Nothing: a task of this module imports it where it runs."""


@contextlib.contextmanager
def signals_kept():
    """Ctrl-C's (SIGTERM's) and SIGUSR1's handlers as they were once Ray Tune's run ends: Tune installs its own for
    its run and puts the old one back only once one fires, so the first Ctrl-C or SIGTERM of the re-measurement after
    it went to Tune's, which ended nothing (a README walk: the pairs ran on after a SIGTERM)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)


def shutdown_ray() -> None:
    """Stop the Ray `init_ray` started, then let its reaper go. A Ray handle
    finalized after the shutdown reaches the core worker, which ends the process
    with exit code 1 and nothing said but "The core worker has already been
    shutdown" (from a thread other than the main one): 3 of 12 program searches
    on 2 cores ended so after their last trial, while the plots' thread ran beside
    the shutdown. Ray Tune leaves handles in reference cycles: they are collected
    first, while Ray runs (0 of 6 ended so since; the mechanism is inferred, not
    shown: a collection after the shutdown in the main thread did not crash)."""
    import gc

    import ray

    global _reaper
    gc.collect()
    node = getattr(ray._private.worker, "_global_node", None)
    session = node.get_session_dir_path() if node is not None else None
    ray.shutdown()
    reaper.stop(_reaper)
    _reaper = None
    if session:
        remove_session(Path(session))


def remove_session(session: Path) -> None:
    """The session dir of a Ray this process started and stopped (under $TMPDIR/ray: its logs, sockets and the
    runtime's files, ~0.4 MB), and `session_latest` where it points there: a README walk found one left per search.
    The trials' own logs are in the run dir."""
    latest = session.parent / "session_latest"
    if latest.is_symlink() and latest.resolve() == session.resolve():
        latest.unlink(missing_ok=True)
    shutil.rmtree(session, ignore_errors=True)


class DriverOnly:
    """Ray pickles callbacks and stoppers into its experiment state; what they hold
    (the recorder: live view, MLflow client; the stoppers, which read it) lives in
    the driver only and is left out."""

    def __init__(self, held):
        self.held = held

    def __getstate__(self):
        return {}


class RecordTrials(DriverOnly, tune.Callback):
    """Where a trial's result lands in the driver: its files unpacked (a trial on another node), its
    `TrialResult` parsed from what Ray Tune carried (`records.run_dir.result_of`, once), told to the strategy
    (`Proposer.complete`), then recorded (`Recorder.add`): the study first, as the local backend does."""

    def __init__(self, run: TrialRun):
        super().__init__(run.recorder)
        self.proposer, self.started = run.proposer, run.on_trial_start

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started(trial.config["trial_number"], knobs_of(trial.config))  # the live view's running row

    def on_trial_complete(self, iteration, trials, trial, **info):
        carried = _landed(trial.last_result)
        result = result_of(carried)
        self.proposer.complete(trial.trial_id, result)
        self.held.add(trial.config, result, trial_dir=carried.get("trial_dir"), launch=carried)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = trial.get_pickled_error()
        carried = _landed(trial.last_result)
        self.proposer.complete(trial.trial_id, None, error=True)
        self.held.add(
            trial.config,
            result_of(carried),
            trial_dir=carried.get("trial_dir"),
            launch=carried,
            ray_error=str(error or "the Ray trial failed"),
        )


def _landed(result: dict | None) -> dict:
    """What Ray Tune carried of a trial to the driver (`records.run_dir.transport`), the files of a trial from
    another node unpacked into the run dir."""
    result = dict(result or {})
    if result.get("files_b64"):
        unpack_dir(result.pop("files_b64"), Path(result["trial_dir"]))
    return result


class Stop(DriverOnly, tune.Stopper):
    """The search's stoppers (`autotune.decide.stoppers`), as Ray Tune asks them
    between trials; all but the time budget end the running trials too: at the budget's
    end no trial starts (`Searcher`), and one still running is cut by its own watch
    (autotune.execution.watch), so it is recorded, not lost."""

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        fired = self.held.fired()
        return fired is not None and not isinstance(fired, Budget)


class RayBackend:
    """Ray Tune runs the trials: on this host (a local Ray bound to loopback, one
    trial at a time on a CPU host) or placed on a cluster's nodes by their
    resources."""

    name = "ray"

    def __init__(self):
        self.address: str | None = None

    def start(self, resources: Resources) -> bool:
        """Ray started (or joined), and SIGTERM made Ctrl-C; whether Ray was started here (`close` stops it)."""
        self.address = resources.ray_address
        started = init_ray(self.address)
        stop_on_sigterm()  # after ray.init, whose core worker installs a handler of its own
        if started and not self.address:
            warm_worker()
        return started

    def shares_forks(self, resources: Resources) -> bool:
        """Whether trials may share the driver's fork server: a local Ray's trials run on this host (a caller's
        own Ray may have nodes anywhere)."""
        import ray

        return not resources.ray_address and not ray.is_initialized()

    def detect_device(self, resources: Resources) -> K.Device:
        return detect_device(resources)

    def placed(self, settings: RunSettings) -> RunSettings:
        """The trials' settings with the driver's node (a trial elsewhere sends its files back)."""
        import ray

        return settings.placed(driver_node=ray.get_runtime_context().get_node_id())

    def reader(self, settings: RunSettings, *, cuda: bool, target_ci: float):
        """The reference reads (`autotune.execution.reads`), in the driver between trials, through its fork
        server: where the trials run one at a time on this host (a local Ray on a CPU host, `run_trials`); None
        elsewhere (a cluster's trials run on its nodes, GPU trials side by side): each trial's own figure stands."""
        return reader(settings, target_ci) if settings.fork_socket and not cuda else None

    def run_trials(self, run: TrialRun) -> None:
        """The trials through Ray Tune, each placed by `run.reserve(config)` (its CPUs, GPUs and custom resources)
        and the resources' rank placement, until a stopper says stop or the time budget runs out."""
        resources, settings, reserve = run.resources, run.settings, run.reserve  # what Ray pickles: no `run`
        # failed trials report no throughput; Optuna records them as FAIL (see Searcher)
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
        # Tune's own per-trial result files would duplicate trials.csv (and the trial
        # files that travel back from other nodes)
        os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
        trainable_ = tune.with_resources(
            tune.with_parameters(trainable, settings=settings),
            lambda config: placement(reserve(config), resources.rank_placement, resources.ranks_per_trial),
        )
        tuner = tune.Tuner(
            trainable_,
            tune_config=tune.TuneConfig(
                search_alg=Searcher(run.proposer, run.stop),
                num_samples=max(run.remaining, 1),
                # a local CPU host runs one trial at a time (two at once disturb each
                # other's numbers); GPUs and cluster nodes are placed by resources
                max_concurrent_trials=None if run.cuda or resources.ray_address else 1,
                # the budget is the search's stoppers' and each trial's watch's: Ray Tune's own would end a
                # trial running at its end unrecorded
                # the Ray actor only reserves resources and starts the trial process,
                # which is fresh every time: reusing actors saves ~3 s a trial and
                # carries no torch state from one trial to the next
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name="ray",
                storage_path=settings.run_dir,
                verbose=0,
                callbacks=[RecordTrials(run)],
                stop=Stop(run.stop),
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
        if run.remaining > 0:
            with signals_kept():
                tuner.fit()
        if not run.stop.stop():  # Tune ended before any stopper did: Ctrl-C or SIGTERM
            run.interrupted.set = True

    def remeasurers(self, settings: RunSettings):
        return remeasurers(settings, local=bool(settings.fork_socket))

    def close(self, started: bool) -> None:
        if started:
            shutdown_ray()
