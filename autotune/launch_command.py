"""A launcher's command line as the workload: `torchrun [OPTS] script.py ARGS`, `python -m torch.distributed.run
[OPTS] ...` (`torch.distributed.launch` with `--use-env`), and `accelerate launch [OPTS] script.py ARGS`. `of` reads
it with the launcher's own parser (torch's `get_args_parser`; accelerate's `launch_command_parser`, its defaults
and config file as `accelerate launch` settles them, and its own functions for the environment it gives a rank)
into what a trial runs itself (`Launch`): the command each rank runs (`python script.py ARGS`, `python -m MODULE
ARGS`), how many ranks, and the environment the launcher gives each one beyond torchrun's (RANK, WORLD_SIZE,
MASTER_ADDR..., which the trial sets: autotune.trial.ranks.torchrun_env). A trial's ranks run on one node: a
multi-node line is refused (`LaunchError`, one line: what is wrong, what is allowed).

Needs neither torch nor accelerate to tell a launcher's line from another (`launcher_of`); reading one imports the
launcher's package."""

from __future__ import annotations

import argparse
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
ACCELERATE_MODULE = "accelerate.commands.launch"
# what each launcher names its ranks' count, for the messages
RANKS_FLAG = {"torchrun": "--nproc-per-node", "accelerate": "--num_processes"}


class LaunchError(ValueError):
    """A launcher's line autotune cannot run as trials; str() is the one line a user sees."""


@dataclass(frozen=True)
class Launch:
    """What a launcher's line stands for: `launcher`, the line up to its script (`torchrun --nproc-per-node 2`,
    a module flag included); `command`, what each rank runs (`python train.py ARGS`); `ranks`, how many;
    `env`, what the launcher sets for every rank beyond torchrun's environment (accelerate's ACCELERATE_*);
    `rank_env`: whether its ranks get torchrun's environment (RANK, WORLD_SIZE...), at one rank too."""

    launcher: list[str]
    command: list[str]
    ranks: int
    env: dict[str, str] = field(default_factory=dict)
    rank_env: bool = True


def _python(arg: str) -> bool:
    return bool(re.fullmatch(r"python[\d.]*", Path(arg).name))


def launcher_of(command: list[str]) -> tuple[str, int] | None:
    """Which launcher `command` runs and where its own options start: ("torchrun" | "launch" | "accelerate",
    index); None for another command."""
    name = Path(command[0]).name
    if name == "torchrun":
        return "torchrun", 1
    if name == "accelerate" and command[1:2] == ["launch"]:
        return "accelerate", 2
    if name == "accelerate-launch":
        return "accelerate", 1
    if _python(command[0]) and command[1:2] == ["-m"] and len(command) > 2:
        module = command[2]
        if module in TORCHRUN_MODULES:
            return ("torchrun" if module == TORCHRUN_MODULES[0] else "launch"), 3
        if module == ACCELERATE_MODULE:
            return "accelerate", 3
    return None


def of(command: list[str], dir: str | Path = ".") -> Launch | None:
    """What `command` stands for where it is a launcher's line (None: it is not one), run from `dir` (where
    accelerate's --config_file is read). LaunchError: a line no trial can run (its message names the option
    and what is allowed)."""
    found = launcher_of(command)
    if found is None:
        return None
    kind, start = found
    if kind == "accelerate":
        return _accelerate(command, start, Path(dir))
    return _torchrun(command, start, legacy=kind == "launch")


def line(launcher: list[str], command: list[str]) -> list[str]:
    """The user's own line from a `Launch`'s parts: the launcher's, then the per-rank command's script (or
    module) and arguments, as a rank's command has them (its searched flags included)."""
    return [*launcher, *command[2 if command[1:2] == ["-m"] else 1 :]]


# --- accelerate's own reading of its flags, as the environment it sets ------------------------------------------

ACCELERATE_PRECISION = {"no": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}  # fp8: no precision knob
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")


def own_knobs(env: dict[str, str]) -> dict[str, str]:
    """The knob values a launcher's environment sets for the program (accelerate's mixed precision and dynamo:
    `accelerate launch --mixed_precision bf16` is precision bf16-mixed): its own settings, the baseline's."""
    out = {}
    if env.get("ACCELERATE_MIXED_PRECISION") in ACCELERATE_PRECISION:
        out["precision"] = ACCELERATE_PRECISION[env["ACCELERATE_MIXED_PRECISION"]]
    backend, mode = env.get("ACCELERATE_DYNAMO_BACKEND"), env.get("ACCELERATE_DYNAMO_MODE")
    if backend == "NO":
        out["compile"] = "none"
    elif backend == "INDUCTOR" and mode in DYNAMO_MODES:
        out["compile"] = mode
    return out


# --- reading a line --------------------------------------------------------------------------------------------


def _parse(parser: argparse.ArgumentParser, args: list[str], name: str) -> argparse.Namespace:
    """`parser` (the launcher's own) on `args`; its complaint (it would print usage and exit) as a LaunchError."""

    def refuse(message: str = "") -> None:
        raise LaunchError(f"{name}: {message or 'cannot read its options'}; give `{name} [OPTIONS] script.py ARGS`")

    parser.error = refuse  # type: ignore[method-assign]
    parser.exit = lambda status=0, message=None: refuse((message or "").strip())  # type: ignore[method-assign]
    return parser.parse_args(args)


def _split(command: list[str], parsed: argparse.Namespace, module: bool) -> tuple[list[str], list[str]]:
    """(the launcher's part of `command`, the rank's command): the script is the token before its arguments."""
    at = len(command) - len(parsed.training_script_args) - 1
    return command[:at], ["python", *(["-m"] if module else []), *command[at:]]


def _local(host: str) -> bool:
    host = host.strip("[]")
    names = {"", "localhost", "::1", "0.0.0.0", socket.gethostname(), socket.getfqdn()}
    return host in names or host.startswith("127.")


def _torchrun(command: list[str], start: int, *, legacy: bool) -> Launch:
    import torch.distributed.run as run

    name = "python -m torch.distributed.launch" if legacy else command[0] if start == 1 else "torch.distributed.run"
    parser = run.get_args_parser()
    if legacy:
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
    args = _parse(parser, command[start:], name)
    if legacy and not args.use_env:
        raise LaunchError(
            "`python -m torch.distributed.launch` passes `--local-rank` to each rank's script; allowed: add "
            "`--use-env` (the script reads LOCAL_RANK), or run `torchrun`"
        )
    if args.no_python:
        raise LaunchError(
            "`--no-python`: each rank's program runs under Python in a trial; allowed: a Python script or `-m MODULE`"
        )
    try:
        _, nodes = run.parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        raise LaunchError(f"`--nnodes {args.nnodes}`: not a count or MIN:MAX; allowed: --nnodes 1") from None
    if nodes > 1:
        raise LaunchError(
            f"`--nnodes {args.nnodes}`: a trial's ranks run on one node; allowed: --nnodes 1 (the ranks come "
            "from --nproc-per-node)"
        )
    for option, address in (("--rdzv-endpoint", args.rdzv_endpoint), ("--master-addr", args.master_addr)):
        host = address.rsplit(":", 1)[0] if option == "--rdzv-endpoint" and ":" in address else address
        if not args.standalone and not _local(host):
            raise LaunchError(
                f"`{option} {address}`: another host; a trial's ranks run on this one; allowed: this host "
                "(localhost, 127.0.0.1) or the option left out"
            )
    try:
        ranks = run.determine_local_world_size(args.nproc_per_node)
    except ValueError as e:
        raise LaunchError(
            f"`--nproc-per-node {args.nproc_per_node}`: {str(e).rstrip('.')}; allowed: a count, auto or cpu (this host's CPUs)"
        ) from None
    if ranks < 1:
        raise LaunchError(f"`--nproc-per-node {args.nproc_per_node}`: allowed: 1 or more")
    launcher, rank = _split(command, args, args.module)
    return Launch(launcher, rank, ranks)


def _accelerate(command: list[str], start: int, dir: Path) -> Launch:
    try:
        from accelerate import utils as U
        from accelerate.commands import launch as A
    except ImportError:
        raise LaunchError(
            f"`{' '.join(command[:start])}`: accelerate is not installed where autotune runs; allowed: "
            "`pip install accelerate` there, or a torchrun line"
        ) from None
    import logging

    name = "accelerate launch"
    args = _parse(A.launch_command_parser(), command[start:], name)
    if args.config_file and not Path(args.config_file).is_absolute():  # read where the command runs
        args.config_file = str(dir / args.config_file)
    quiet, level = logging.getLogger(A.__name__), logging.getLogger(A.__name__).level
    quiet.setLevel(logging.ERROR)  # its note on the defaults it chose: the line's own, as `accelerate launch` runs it
    try:
        args, defaults, _ = A._validate_launch_command(args)  # what `accelerate launch` settles first (1.16)
    except (ValueError, FileNotFoundError) as e:
        raise LaunchError(f"{name}: {e}") from None
    finally:
        quiet.setLevel(level)
    machines = int(args.num_machines or 1)
    if machines > 1:
        raise LaunchError(
            f"`--num_machines {machines}`: a trial's ranks run on one machine; allowed: --num_machines 1 (the "
            "ranks come from --num_processes)"
        )
    if args.no_python:
        raise LaunchError(
            "`--no_python`: each rank's program runs under Python in a trial; allowed: a Python script or `-m MODULE`"
        )
    sagemaker = defaults is not None and defaults.compute_environment == A.ComputeEnvironment.AMAZON_SAGEMAKER
    others = {  # launchers of their own, as `accelerate launch` picks them (launch_command)
        "--use_deepspeed": ("DeepSpeed's launcher", args.use_deepspeed and not args.cpu),
        "--tpu": ("the TPU launcher", args.tpu and not args.cpu),
        "--mpirun_hostfile": ("mpirun", bool(args.mpirun_hostfile)),
        "compute_environment: AMAZON_SAGEMAKER": ("SageMaker", sagemaker),
    }
    for option, (what, given) in others.items():
        if given:
            raise LaunchError(
                f"`{option}`: {what} starts the ranks, which a trial cannot; allowed: accelerate's own launcher "
                "(one process, or --multi_gpu/--use_fsdp ranks under torchrun's environment)"
            )
    torchrun = (args.multi_gpu or args.use_fsdp or args.use_megatron_lm) and not args.cpu
    try:
        if torchrun:  # its multi-GPU launcher: torchrun, with this environment
            env = U.prepare_multi_gpu_env(args)
            if not U.check_cuda_p2p_ib_support():  # what it adds on GPUs without P2P
                env = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", **env}
            ranks = int(args.num_processes)
        else:  # its simple launcher: one process (`--cpu` ranks need mpirun, with --mpirun_hostfile)
            _, env = U.prepare_simple_launcher_cmd_env(args)
            ranks = 1
    except (ValueError, RuntimeError) as e:
        raise LaunchError(f"{name}: {e}") from None
    own = {  # beyond this environment (a trial's) and torchrun's (the trial sets it)
        k: v for k, v in env.items() if os.environ.get(k) != v and k not in ("MASTER_ADDR", "MASTER_PORT")
    }
    launcher, rank = _split(command, args, bool(args.module))
    return Launch(launcher, rank, ranks, own, rank_env=torchrun)
