"""Workloads for tests: small, real, and instrumented to show what a knob did."""

import signal

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from autotune import Workload


class Recorder(nn.Module):
    """A small conv net that records what it saw inside forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append(
            {
                "batch": x.shape[0],
                "channels_last": x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
                "autocast": torch.is_autocast_enabled(x.device.type),
                "autocast_dtype": torch.get_autocast_dtype(x.device.type),
            }
        )
        return self.head(self.conv(x).mean((2, 3)))


class WorkerTagged(Dataset):
    """Each sample carries the id of the loader worker that made it (-1: main process)."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        info = get_worker_info()
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 8, 8, generator=g), i % 4, info.id if info else -1


def recorder_loss(model, batch):
    images, labels, _ = batch
    return nn.functional.cross_entropy(model(images), labels)


def make_recording(batch_size: int = 8) -> Workload:
    return Workload(model=Recorder, dataset=WorkerTagged(), loss=recorder_loss, batch_size=batch_size)


def make_failing(batch_size: int = 8) -> Workload:
    """Its loss has a shape error: the trial must fail with the message, not crash."""

    def bad_loss(model, batch):
        images, labels, _ = batch
        return nn.functional.cross_entropy(model(images)[:, :2].T, labels)

    return Workload(model=Recorder, dataset=WorkerTagged(), loss=bad_loss, batch_size=batch_size)


def not_a_workload():
    return {"model": None}


def make_faulty(batch_size: int = 16) -> Workload:
    """A fault per configuration, to show a search survives each:
    batch 64 hangs with a loader worker (and trains without one) and batch 128
    runs out of memory; below that, a loader worker is killed by a signal, and
    without one batch 32 makes the loss NaN while batch 16 trains fine (the
    baseline)."""
    import os
    import signal
    import time

    def collate(samples):  # runs in the loader worker, and knows the batch size
        if get_worker_info() is not None and len(samples) < 64:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.utils.data.default_collate(samples)

    def loss(model, batch):
        images, labels, worker = batch
        n = images.shape[0]
        if n == 128:
            raise torch.OutOfMemoryError("out of memory: tried to allocate 2.00 GiB (injected by the test workload)")
        if n == 64 and int(worker[0]) >= 0:  # made by a loader worker: the trial's workers must go with it
            time.sleep(3600)
        value = nn.functional.cross_entropy(model(images), labels)
        return value * float("nan") if n == 32 else value

    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size, collate_fn=collate)


def make_fork_unsafe(batch_size: int = 16) -> Workload:
    """tests/programs/hang_loop.py's model and Dataset as a factory: its Dataset reads through a loader thread made
    in `__init__`, which a forked loader worker lacks: with workers, a trial waits forever for its first batch."""
    from tests.programs.hang_loop import TinyGPT, Windows

    def loss(model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    return Workload(model=lambda: TinyGPT(64, 16), dataset=Windows(20_000, 16, 64), loss=loss, batch_size=batch_size)


class Offset(nn.Module):
    """A linear model whose output sits on a large offset: in bf16 (8 bits of
    mantissa) 1000 + y rounds to steps of 4-8, so the loss no longer matches fp32."""

    def __init__(self, scale: float = 1.0, offset: float = 1000.0):
        super().__init__()
        self.lin = nn.Linear(16, 1)
        self.scale, self.offset = scale, offset

    def forward(self, x):
        return self.lin(x) * self.scale + self.offset


class Vectors(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def make_precision_sensitive(batch_size: int = 32) -> Workload:
    def loss(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x).float(), y + model.offset)

    return Workload(model=Offset, dataset=Vectors(), loss=loss, batch_size=batch_size)


def make_fp16_overflow(batch_size: int = 32) -> Workload:
    """Activations of ~1e6: fine in fp32 and bf16, inf in fp16 (max 65504)."""

    def loss(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x).float() / 1e6, y)

    return Workload(model=lambda: Offset(scale=1e6, offset=0.0), dataset=Vectors(), loss=loss, batch_size=batch_size)


def make_slow_large_batches(batch_size: int = 16, sleep_s: float = 0.04) -> Workload:
    """Batches above 16 samples cost `sleep_s` (40 ms) a step: several times slower per sample."""
    import time

    def loss(model, batch):
        if batch[0].shape[0] > 16:
            time.sleep(sleep_s)
        return recorder_loss(model, batch)

    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)


def make_drifting(batch_size: int = 16, sleep_s: float = 0.2) -> Workload:
    """The host changes under one config: steps at the batch size named by
    AUTOTUNE_TEST_SLOW_BATCH, or written in the file AUTOTUNE_TEST_SLOW_FILE names
    once it is there (read at each step: a search's test writes it as its trials
    end), cost `sleep_s` more, as if another job had started (a winner that a
    re-measurement rejects)."""
    import os
    import time

    def slow() -> int:
        named, path = os.environ.get("AUTOTUNE_TEST_SLOW_BATCH"), os.environ.get("AUTOTUNE_TEST_SLOW_FILE")
        if not named and path and os.path.exists(path):
            with open(path) as f:
                named = f.read().strip()
        return int(named or 0)

    def loss(model, batch):
        if batch[0].shape[0] == slow():
            time.sleep(sleep_s)
        return recorder_loss(model, batch)

    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)


def make_slowing(batch_size: int = 16, sleep_s: float = 0.02, clock: str = "", per_s: float = 0.0) -> Workload:
    """A host whose speed drifts, known exactly: each step sleeps `sleep_s` x (1 + `per_s` x the seconds since the
    search's first step, whose Unix time the first step of any process writes to the file `clock`), whatever its
    batch. So half the sleep is 2x the samples/s at any one time (a known ratio), and every config slows down
    alike as wall time passes (a sleep waits for no CPU: steady on a loaded host)."""
    import os
    import time

    since = []

    def loss(model, batch):
        if not since:
            try:
                with open(clock, "x") as f:
                    f.write(str(time.time()))
            except FileExistsError:
                pass
            since.append(float(open(clock).read() or time.time()))
        time.sleep(sleep_s * (1 + per_s * max(0.0, time.time() - since[0])))
        return recorder_loss(model, batch)

    assert os.path.isabs(clock), "clock: an absolute path (trials run in their own dirs)"
    torch.set_num_threads(1)  # its compute: one thread, no pool to wait for on a loaded host
    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)


class SlowReads(WorkerTagged):
    """Each sample waits `read_s` (storage) before it is made: a loader whose rate is known, 1 / read_s samples/s a
    worker at most."""

    def __init__(self, read_s: float):
        self.read_s = read_s

    def __getitem__(self, i):
        import time

        time.sleep(self.read_s)
        return super().__getitem__(i)


def make_slow_reads(batch_size: int = 4, read_s: float = 0.01, first_step_s: float = 0.0) -> Workload:
    """Input-bound: a tiny model fed by samples that each wait `read_s` (tests.workloads.SlowReads); its first step
    takes `first_step_s` more (a compile, an allocator growing), while the loader's workers fill their queue."""
    import time

    first = []

    def loss(model, batch):
        if not first:
            first.append(time.sleep(first_step_s))
        return recorder_loss(model, batch)

    return Workload(model=Recorder, dataset=SlowReads(read_s), loss=loss, batch_size=batch_size)


def make_sleepy(batch_size: int = 8, sleep_s: float = 0.02) -> Workload:
    """A fixed cost per step (`sleep_s`, a launch or a sync) over a tiny model:
    overhead-bound, and steady on a loaded host (a sleep does not wait for a CPU)."""
    import time

    def loss(model, batch):
        time.sleep(sleep_s)
        return recorder_loss(model, batch)

    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)


def make_raising(batch_size: int = 16) -> Workload:
    """A factory that fails the way user code does (its message has square brackets)."""
    raise ValueError("expected a batch like [images, labels] from the dataset")


class Small(Dataset):
    def __init__(self, samples: int):
        self.samples = samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i)), i % 4


def make_small(samples: int = 20, batch_size: int = 8) -> Workload:
    """A dataset of a few samples: batch sizes above it cannot make one batch."""
    return Workload(
        model=Recorder,
        dataset=Small(samples),
        batch_size=batch_size,
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
    )


LEAKED = []  # what a trial left in its process: a later trial must never see it


def make_leaky(batch_size: int = 8) -> Workload:
    """Records the process state it finds (in seen.json, in the trial dir), then
    leaves some behind: cuDNN and TF32 flags, fp32 matmul precision, threads, and
    memory held by a module global (the allocator grown)."""
    import json
    import os

    from autotune.host import procfs

    # the parent's parent (a shared fork server's handler's: the server)
    grandparent = procfs.process(os.getppid()).ppid
    import gc

    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "grandparent": grandparent,
        "frozen": gc.get_freeze_count(),
        "mark": os.environ.get("AUTOTUNE_TEST_MARK"),
        "server_only": os.environ.get("AUTOTUNE_TEST_SERVER_ONLY"),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "leaked_tensors": len(LEAKED),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    }
    with open("seen.json", "w") as f:
        json.dump(seen, f)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")
    torch.set_num_threads(1)
    LEAKED.append(torch.ones(16 * 2**20))  # 64 MiB kept alive
    return Workload(
        model=Recorder,
        dataset=WorkerTagged(),
        batch_size=batch_size,
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
    )


class Shifted(nn.Module):
    """A linear model whose prediction and target sit on a large shared offset,
    both in the autocast dtype: their difference, the loss, is a difference of two
    large nearly equal terms. In bf16 (spacing 64 at 1e4) or fp16 (8) the residuals
    round to 0: no loss, no gradient, a model that does not train."""

    def __init__(self, offset: float = 1e4):
        super().__init__()
        self.lin = nn.Linear(16, 1)
        self.offset = offset

    def forward(self, x):
        return self.lin(x) + self.offset


def make_vanishing(batch_size: int = 32, offset: float = 1e4) -> Workload:
    def loss(model, batch):
        x, y = batch
        pred = model(x)
        target = y.to(pred.dtype) + model.offset
        return ((pred - target).float() ** 2).mean()

    return Workload(model=lambda: Shifted(offset), dataset=Vectors(), loss=loss, batch_size=batch_size)


class NaiveNorm(nn.Module):
    """Normalization with the variance as E[x^2] - E[x]^2, on features with a large
    mean (100): exact enough in fp32, cancellation in bf16 (spacing 64 at 1e4)."""

    def __init__(self, width: int = 32, classes: int = 4):
        super().__init__()
        self.lin = nn.Linear(16, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.lin(x) + 100.0
        mean = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mean * mean
        return self.head((h - mean) / (var.clamp_min(0) + 1e-5).sqrt())


def make_naive_variance(batch_size: int = 32) -> Workload:
    def loss(model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x).float(), (y[:, 0] > 0).long())

    return Workload(model=NaiveNorm, dataset=Vectors(), loss=loss, batch_size=batch_size)


def make_chaotic(batch_size: int = 16, lr: float = 0.5) -> Workload:
    """The tiny CNN at a learning rate where training is chaotic: rounding-level
    differences grow to large loss differences within a few steps."""
    from trials.tiny_cnn import make_workload

    wl = make_workload(batch_size=batch_size, width=8)
    wl.optimizer = lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    return wl


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
    "lbfgs": lambda p: torch.optim.LBFGS(p),
}


def make_with_optimizer(optimizer: str = "adamw", batch_size: int = 8) -> Workload:
    """The recording net trained by one of torch's optimizers (OPTIMIZERS)."""
    return Workload(
        model=Recorder,
        dataset=WorkerTagged(),
        loss=recorder_loss,
        batch_size=batch_size,
        optimizer=OPTIMIZERS[optimizer],
    )


def make_model_bound_optimizer(batch_size: int = 8) -> Workload:
    """An optimizer that takes only its own model's parameters (as a LightningModule's
    configure_optimizers does): RMSprop, which torch cannot fuse."""

    def optimizer(params):
        params = list(params)
        if len(params) != 4:  # Recorder: conv and head, weight and bias
            raise ValueError("not my model's parameters")
        return torch.optim.RMSprop(params, lr=1e-3)

    return Workload(
        model=Recorder, dataset=WorkerTagged(), loss=recorder_loss, batch_size=batch_size, optimizer=optimizer
    )


def make_rank_one_fails(batch_size: int = 8) -> Workload:
    """tiny_transformer whose model cannot be built on rank 1 (a multi-rank trial's teardown)."""
    import os

    from trials.tiny_transformer import make_workload

    workload = make_workload(batch_size=batch_size)
    build = workload.model

    def model():
        if os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1 cannot build its model")
        return build()

    workload.model = model
    return workload


def make_summed_loss(batch_size: int = 8) -> Workload:
    """tiny_transformer with its loss summed over the batch, not averaged: on N
    ranks, DDP's average of the ranks' gradients is 1/N of one global batch's."""
    from torch import nn

    from trials.tiny_transformer import make_workload

    workload = make_workload(batch_size=batch_size)
    workload.loss = lambda model, batch: nn.functional.cross_entropy(
        model(batch["input_ids"]), batch["labels"], reduction="sum"
    )
    return workload


class Talking(Recorder):
    """Prints when built, as nanoGPT's GPT() prints its parameter count."""

    def __init__(self):
        super().__init__()
        print(f"number of parameters: {sum(p.numel() for p in self.parameters())}")


def make_talking(batch_size: int = 8, fail_rank: int | None = None, hang: bool = False) -> Workload:
    """A model that prints when built (stdout) and a loss that writes to stderr on
    its first step. `fail_rank`: that rank cannot build its model; `hang`: the
    loss sleeps for an hour. Also prints what its parent's parent runs (a shared
    fork server's handler's: the server, `--listen`)."""
    import os
    import sys
    import time

    from autotune.host import procfs

    print("forked from:", procfs.cmdline(procfs.process(os.getppid()).ppid))

    def model():
        rank = os.environ.get("RANK")
        if rank is not None:
            print(f"rank {rank} builds its model")
        if rank == str(fail_rank):
            raise RuntimeError(f"rank {rank} cannot build its model")
        return Talking()

    warned = []

    def loss(model, batch):
        if not warned:
            print("warning: labels look unbalanced", file=sys.stderr)
            warned.append(True)
        if hang:
            time.sleep(3600)
        return recorder_loss(model, batch)

    return Workload(model=model, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)


def make_compute_bound(batch_size: int = 32) -> Workload:
    """An MLP over samples already in memory: the step is matmuls, the loader
    hands out slices of a tensor (a baseline that hardly waits on data: at hidden
    width 1024 a step took 5.3 ms and the loader's 0.45 ms of it read as 8.5% data
    wait in CI; at 2048 the step is ~3.5x the work)."""
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(4096, 256, generator=g), torch.randint(0, 10, (4096,), generator=g)
    )

    def model():
        return nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))

    return Workload(
        model=model,
        dataset=data,
        batch_size=batch_size,
        loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
    )


class StaleCast(nn.Module):
    """Under autocast, a low-precision copy of the weights cast once and kept across
    steps (the TransformerEngine-style weight cache, with its "refresh after the
    optimizer step" forgotten): refreshed when a state is loaded, never after a
    step. Its forward sees the weights it was loaded with; the gradient reaches the
    real weights (straight through), so a single step from any loaded state is
    exact, and a run never trains."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.cache = None
        self.register_load_state_dict_pre_hook(lambda *_: setattr(self, "cache", None))

    def forward(self, x):
        if not torch.is_autocast_enabled(x.device.type):
            return self.net(x)
        params = dict(self.net.named_parameters())
        if self.cache is None:
            self.cache = {n: p.detach().clone() for n, p in params.items()}
        used = {n: p + (self.cache[n] - p).detach() for n, p in params.items()}
        return torch.func.functional_call(self.net, used, (x,))


def make_stale_cast(batch_size: int = 16, lr: float = 10.0) -> Workload:
    """make_chaotic (its baseline's loss over fresh batches diverges), its forward
    under bf16 on a stale weight copy (StaleCast): the candidate does not train,
    each step from identical state is exact."""
    wl = make_chaotic(batch_size, lr)
    net = wl.model
    wl.model = lambda: StaleCast(net())
    return wl


# --- a language model: a tiny random-init Llama (transformers), no hub ----------------------------------------------

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def tiny_llama(tie_word_embeddings: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA, tie_word_embeddings=tie_word_embeddings))


class Texts(Dataset):
    """Token sequences of 4 to 24 ids (ids 1..63; 0 pads), each its own length, seeded by its index."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(4, 25, (1,), generator=g))
        return {"input_ids": torch.randint(1, LLAMA["vocab_size"], (n,), generator=g).tolist()}


def pad_texts(samples: list[dict]) -> dict:
    """A padded batch, as a tokenizer's padding collator makes it: right-padded ids, the attention mask, labels
    -100 where padded."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[row, : len(s["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def llama_loss(model, batch):
    return model(**batch).loss


def make_tiny_llama(batch_size: int = 4, padding_free: bool = False) -> Workload:
    """The tiny Llama on `Texts`: padded batches (`pad_texts`), or with `padding_free` transformers'
    DataCollatorWithFlattening (one row, position ids restarting at each text)."""
    from transformers import DataCollatorWithFlattening

    return Workload(
        model=tiny_llama,
        dataset=Texts(),
        loss=llama_loss,
        batch_size=batch_size,
        collate_fn=DataCollatorWithFlattening(return_tensors="pt") if padding_free else pad_texts,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )


HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"  # busy until its parent ends


def make_hogged(batch_size: int = 16, work_ms: float = 20.0, hog: str = "none", hogs: int = 3) -> Workload:
    """Each step burns `work_ms` of its thread's CPU time (one torch thread), so its rate is the share of a core
    it gets. A re-measurement's baseline run (its trial dir `confirm/NN-baseline`, or `confirm/later-NN-baseline`
    for the pairs taken again) pins itself to one core and starts `hogs` busy processes of its own there, which end
    with it: a slow phase of the host (the baseline gets ~1/(hogs+1) of a core, on any host) that the disturbance
    check cannot see (they are the trial's own process tree), on the baseline's side only. `hog`: "none"; "all"
    (every such run); "first" (the first pairs', not those taken again)."""
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    here = Path.cwd()
    label = re.fullmatch(r"(later-)?\d\d-baseline(-again\d+)?", here.name)
    if here.parent.name == "confirm" and label and (hog == "all" or (hog == "first" and not label.group(1))):
        import os

        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the hogs inherit it: one core for all
        for _ in range(hogs):
            subprocess.Popen([sys.executable, "-c", HOG])

    def loss(model, batch):
        started = time.thread_time()
        while time.thread_time() - started < work_ms / 1000:
            pass
        return recorder_loss(model, batch)

    torch.set_num_threads(1)
    return Workload(model=Recorder, dataset=WorkerTagged(), loss=loss, batch_size=batch_size)
