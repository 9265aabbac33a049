"""torch itself, instrumented: a training loop that knows nothing of autotune is measured and tuned through the
process-wide hooks torch offers and a few class patches, each undone by `uninstall()`. Installed once torch is
imported (at once in a forked trial: the fork server imported it), in a trial and under `autotune run`.

What it reports to the process's config (`autotune.config()`), where neither the program (`cfg.steps`,
`cfg.step`, `cfg.data`) nor a framework's callback (a Trainer's) claims the steps (`Loop.claim`):
- a step: an optimizer step (`register_optimizer_step_post_hook`), of the optimizer with the most parameters
  where there are several; a GradScaler's skipped step (inf or NaN gradients) is still a step;
- its samples and tokens: the outermost module's forward inputs in grad mode since the last step (the leading
  dimension; a language model's tokens as autotune.trial.tokens counts them from `input_ids` and its mask, or
  an integer input's elements). The outermost module is the first module called in grad mode that holds
  trainable parameters: a process-wide forward pre-hook finds it at its first call and is removed; a hook of
  its own counts from there on (no hook on any other module: no cost per module call);
- the data wait: the time in a DataLoader iterator's `next()` (none: "unknown");
- the loss: the scalar each `backward()` runs on (a GradScaler's scaled loss unscaled), summed over a step's
  micro-batches on the device (those before another optimizer's step are its own, left out): read at the
  window's end, no sync inside it;
- the model: the outermost module, handed over for FLOPs, MFU and parity's noise runs (`cfg.watch`).

The knobs reach such a program each the way torch lets it, where the program does not take them itself through
a config method (`cfg.dataloader_kwargs`, `cfg.prepare`, `cfg.autocast`... in `cfg.used`) and no framework's
instrumentation applies them:
- the loader's (and the batch, where the space has it) through `DataLoader.__init__`; padding-free batches by
  its collate function;
- precision: bf16 as autocast around the outermost module's forward, its outputs made fp32 (as Accelerate
  does), unless the program autocasts itself; fp16 only beside an enabled GradScaler of the program's;
- channels_last: the outermost module's weights and its 4-D inputs;
- compile: `Module.compile()` on the outermost module at its first forward (its hooks stay eager:
  `torch.compiler.disable`, so a step is counted outside the graph);
- a transformers model's language-model knobs (autotune.knobs._lm.prepare_lm) on it, there too;
- the fused optimizer at the optimizer's construction; `set_to_none` at `zero_grad`;
- DDP's bucket and graph knobs at `DistributedDataParallel.__init__`, FSDP2's resharding at `fully_shard`.
What the program does itself is recorded as its own value (`cfg.record_own`): the baseline.

A patch changes nothing but the knob it applies. In production a failure of the instrumentation prints one line
and uninstalls it: it never stops the user's job.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import weakref
from collections.abc import Mapping

from autotune.trial import progress
from autotune.trial.tokens import count as count_tokens
from autotune.trial.tokens import count_samples, padded

LOADER_OWN = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}
DDP_KNOBS = {
    "ddp_bucket_cap_mb": "bucket_cap_mb",
    "ddp_gradient_as_bucket_view": "gradient_as_bucket_view",
    "ddp_static_graph": "static_graph",
}
NO_SCALER = "your loop scales its loss with no enabled GradScaler: fp16 needs one (bf16 does not)"


class TorchHooks:
    """The instrumentation of torch for one process's config `cfg` (see the module doc)."""

    def __init__(self, cfg):
        self.cfg, self.loop, self.dir = cfg, cfg.loop, cfg.trial_dir
        self.undo: list = []
        self.model = None  # the outermost module, once found
        self.sizes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> its parameters
        self.samples, self.tokens, self.sequences, self.loss = 0, 0, 0, None  # since the last step
        self.slots = 0  # a language model's token slots since the last step, padding included
        self.unscaled: dict[int, object] = {}  # id(scaler.scale(loss)) -> loss
        self.scaler = False  # an enabled GradScaler scaled a loss
        self.stepped = False  # the post hook ran (a GradScaler's step that did not skip)
        self.autocasts: list = []  # the autocast each forward of the outermost module entered (None: none)
        self.cast = None  # (device type, dtype) the outermost module's forward runs under (precision)
        self.nested = 0  # inside a DataLoader's next() or a backward already timed or read
        self.uncounted = False  # the model's first call, by keywords: counted when it ends
        self.steps = 0
        self.building = False  # inside an optimizer class's __init__ (a subclass's runs its base's)

    # --- installing -------------------------------------------------------------------------------------------

    def install(self) -> None:
        import torch
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        progress.note(self.dir, "torch imported")
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.undo.append(register_optimizer_step_post_hook(self._stepped).remove)
        self.first = torch.nn.modules.module.register_module_forward_pre_hook(self._first_forward)
        self.undo.append(self.first.remove)
        self._patch(torch.optim.Optimizer, "__init__", self._optimizer_made)
        for cls in _fused_optimizers():
            self._patch(cls, "__init__", self._optimizer_init)
        self._patch(torch.amp.GradScaler, "scale", self._scale)
        self._patch(torch.amp.GradScaler, "step", self._scaler_step)
        self._patch(torch.autograd, "backward", self._backward)
        self._patch(_BaseDataLoaderIter, "__next__", self._next)
        self._patch(DataLoader, "__init__", self._loader_init)
        if "set_to_none" in self.cfg.knobs or self.cfg.trial_dir is not None:
            self._patch(torch.optim.Optimizer, "zero_grad", self._zero_grad)
            self._patch(torch.nn.Module, "zero_grad", self._zero_grad)
        self._patch(torch.nn.parallel.DistributedDataParallel, "__init__", self._ddp_init)

    def fully_shard(self, module) -> None:
        """FSDP2's `fully_shard` (patched where its module is imported: autotune.instrument's finder)."""
        self._patch(module, "fully_shard", self._fully_shard)

    def _patch(self, owner, name: str, wrapper) -> None:
        """`owner.name` replaced by `wrapper(original, *args, **kwargs)`; undone by `uninstall`."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

        @functools.wraps(original)
        def patched(*args, **kwargs):
            return wrapper(original, *args, **kwargs)

        setattr(owner, name, patched)
        self.undo.append(lambda: setattr(owner, name, original))

    def uninstall(self) -> None:
        """Every hook removed and every patch undone, the last first."""
        while self.undo:
            self.undo.pop()()

    def _guard(self, fn, *args):
        """`fn(*args)`, the instrumentation's own work: in production a failure prints one line and uninstalls the
        instrumentation (the user's job goes on, untuned from there); in a trial it is the trial's error."""
        try:
            return fn(*args)
        except Exception as e:
            if self.cfg.in_trial:
                raise
            print(f"autotune: the instrumentation of torch stepped aside ({type(e).__name__}: {e})", file=sys.stderr)
            self.uninstall()
            return None

    def _takes(self, method: str) -> bool:
        """Whether this instrumentation applies the knobs of the config method `method` (the program calls it
        itself, or a framework's instrumentation reports: then not)."""
        return self.cfg.framework is None and method not in self.cfg.used

    # --- the steps ---------------------------------------------------------------------------------------------

    def _optimizer_made(self, init, optimizer, *args, **kwargs):
        init(optimizer, *args, **kwargs)
        progress.note(self.dir, "an optimizer made")
        self.sizes[optimizer] = sum(p.numel() for g in optimizer.param_groups for p in g["params"])

    def _main(self, optimizer) -> bool:
        """Whether `optimizer` is the one with the most parameters (its steps are the program's)."""
        size = self.sizes.get(optimizer)
        return size is not None and size >= max(self.sizes.values(), default=0)

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self._main(optimizer):
            self.stepped = True
            self._guard(self._report)
        else:  # another optimizer's step (a GAN's critic): the losses since were its own
            self.loss = None

    def _scaler_step(self, step, scaler, optimizer, *args, **kwargs):
        self.stepped = False
        out = step(scaler, optimizer, *args, **kwargs)
        if not self.stepped and self._main(optimizer):  # skipped (inf or NaN gradients): a step all the same
            self._guard(self._report)
        return out

    def _report(self) -> None:
        samples, tokens, sequences, loss = self.samples, self.tokens, self.sequences, self.loss
        slots = self.slots
        self.samples, self.tokens, self.sequences, self.loss, self.slots = 0, 0, 0, None, 0
        self.unscaled.clear()
        self.steps += 1
        if self.steps == 1 and not self.scaler and "torch:autocast" in self.cfg.used:
            self.cfg.cannot.setdefault("precision=16-mixed", NO_SCALER)
        counted = not (isinstance(samples, int) and samples == 0)  # 0: no forward of the model seen
        counted_tokens = tokens if counted else None
        self.loop.hooked_step(samples if counted else None, loss, counted_tokens, sequences, slots if counted else None)

    def _scale(self, scale, scaler, outputs):
        scaled = scale(scaler, outputs)
        if scaler.is_enabled() and scaled is not outputs:
            self.scaler = True
            self.unscaled[id(scaled)] = outputs
        return scaled

    def _backward(self, backward, tensors, *args, **kwargs):
        if self.nested:  # a backward inside one (reentrant checkpointing): not the loss's
            return backward(tensors, *args, **kwargs)
        progress.note(self.dir, "a backward run")
        loss = tensors if not isinstance(tensors, (tuple, list)) else tensors[0] if len(tensors) == 1 else None
        if loss is not None and getattr(loss, "numel", lambda: 0)() == 1:
            loss = self.unscaled.pop(id(loss), loss).detach()
            self.loss = loss if self.loss is None else self.loss + loss
        self.nested += 1
        try:
            return backward(tensors, *args, **kwargs)
        finally:
            self.nested -= 1

    def _next(self, next_, iterator):
        if self.nested:
            return next_(iterator)
        progress.note(self.dir, "a DataLoader iterated")
        self.nested += 1
        started = time.perf_counter()
        try:
            batch = next_(iterator)
        finally:
            self.nested -= 1
            self.loop.hooked_wait(time.perf_counter() - started)
        if isinstance(batch, Mapping) and "input_ids" in batch and "attention_mask" in batch:
            self.cfg.record_reach("flatten")  # a padded batch: padding-free reaches it (its collate)
        return batch

    # --- the outermost module ---------------------------------------------------------------------------------

    def _first_forward(self, module, args):
        import torch

        progress.note(self.dir, "a forward run")
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in module.parameters()):
            return None
        self.first.remove()
        if self.cfg.framework is not None:  # a Trainer's callback hands over its model and reports
            return None
        return self._guard(self._adopt, module, args)

    def _adopt(self, module, args):
        """`module` is the outermost: the model. Its own values recorded, the model knobs applied, its hooks
        registered; this first call counted (by keywords: at its end, by the post-hook, which sees them)."""
        import torch

        self.model = module
        cfg, knobs = self.cfg, self.cfg.knobs
        cfg.record_model(module)
        cfg.watch(module)
        compiled = isinstance(module, torch._dynamo.eval_frame.OptimizedModule) or getattr(
            module, "_compiled_call_impl", None
        )
        own = {"compile": "default"} if compiled else {}
        device = cfg.device_type
        if torch.is_autocast_enabled(device):  # the program's own autocast
            dtype = torch.get_autocast_dtype(device)
            own["precision"] = {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}.get(dtype, "32")
            cfg.cannot.setdefault("precision", f"your program autocasts its forward itself ({dtype})")
        cfg.record_own(own)
        if self._takes("prepare") and self._takes("wrap"):
            from autotune.knobs import prepare_model
            from autotune.knobs._lm import prepare_lm

            cfg.record_reach("torch:model")
            prepare_lm(module, knobs, cfg.blocks)
            cfg.load_compiled()  # production: the search's compiled artifacts, before its compile
            # in place (the program holds the module); compiled from its next call (this one is eager)
            prepare_model(module, {**knobs, "compile": "none"} if compiled else knobs, in_place=True)
        if self._takes("autocast") and "precision" not in own:
            cfg.record_reach("torch:autocast")
            from autotune.knobs import autocast_dtype

            dtype = autocast_dtype(knobs)
            self.cast = (device, dtype) if dtype is not None else None
        hooks = module.register_forward_pre_hook(_eager(self._forward_pre), with_kwargs=True)
        post = module.register_forward_hook(_eager(self._forward_post), with_kwargs=True, always_call=True)
        self.undo += [hooks.remove, post.remove]
        # this call: its own pre-hook runs from the next, its post-hook from this one (it sees its keywords: a
        # call by keywords alone is counted there)
        self.uncounted = not args
        out = self._forward_pre(module, tuple(args), {}, count=bool(args))
        return None if out is None else out[0]

    def _forward_pre(self, module, args, kwargs, count: bool = True):
        import torch

        if not torch.is_grad_enabled():
            self.autocasts.append(None)
            return None
        if count:
            self._count(args, kwargs)
        changed = None
        if self.cfg.knobs.get("channels_last") and self._takes("prepare"):
            from autotune.knobs import to_channels_last

            changed = (to_channels_last(args), to_channels_last(kwargs))
        cast = None
        if self.cast is not None and not torch.is_autocast_enabled(self.cast[0]):
            cast = torch.autocast(self.cast[0], dtype=self.cast[1])
            cast.__enter__()
        self.autocasts.append(cast)
        return changed

    def _forward_post(self, module, args, kwargs, output):
        if self.uncounted:  # the first call, by keywords: counted now
            self.uncounted = False
            self._count(args, kwargs)
        cast = self.autocasts.pop() if self.autocasts else None
        if cast is None:
            return None
        cast.__exit__(None, None, None)
        from autotune.knobs import map_tensors

        return map_tensors(lambda t: t.float() if t.is_floating_point() else t, output)  # as Accelerate's

    def _count(self, args, kwargs) -> None:
        """One micro-batch's samples, tokens and sequences: a mapping with `input_ids` (its keywords, or its one
        argument) counted as a language model's batch; else the first tensor's rows, and an integer input's
        elements as tokens (token ids)."""
        batch = kwargs if kwargs else (args[0] if len(args) == 1 and isinstance(args[0], Mapping) else None)
        counted = count_tokens(batch) if batch is not None else None
        slots = padded(batch) if counted is not None else None
        if counted is not None:
            samples, (tokens, sequences) = count_samples(batch), counted
        else:
            first = next((a for a in (*args, *kwargs.values()) if hasattr(a, "shape")), None)
            if first is None or not len(first.shape):
                self.samples = self.tokens = self.sequences = self.slots = None
                return
            samples = int(first.shape[0])
            tokens = first.numel() if first.dim() >= 2 and not first.is_floating_point() else None
            sequences = samples if tokens is not None else None
            slots = tokens  # token ids alone: no padding known
        self.samples = _add(self.samples, samples)
        self.tokens = _add(self.tokens, tokens)
        self.sequences = _add(self.sequences, sequences)
        self.slots = _add(self.slots, slots)

    # --- the knobs at construction ----------------------------------------------------------------------------

    def _loader_init(self, init, loader, *args, **kwargs):
        if not self._takes("dataloader_kwargs"):
            return init(loader, *args, **kwargs)
        out = self._guard(self._loader_kwargs, init, loader, args, kwargs)
        return init(loader, **out) if out is not None else init(loader, *args, **kwargs)

    def _loader_kwargs(self, init, loader, args, kwargs) -> dict:
        from autotune.knobs import loader_kwargs, over_loader_kwargs

        bound = inspect.signature(init).bind(loader, *args, **kwargs)
        yours = {k: v for k, v in bound.arguments.items() if k != "self"}
        yours.update(yours.pop("kwargs", {}))  # a DataLoader subclass's own keywords
        cfg, knobs = self.cfg, dict(self.cfg.knobs)
        if "torch:loader" not in cfg.used:  # the first loader's: the one it trains on, before an evaluation's
            own = {k: yours.get(k, v) for k, v in LOADER_OWN.items() if yours.get(k, v) is not None}
            if yours.get("batch_sampler") is None and yours.get("batch_size", 1) is not None:
                own["batch_size"] = yours.get("batch_size", 1)
            else:
                cfg.cannot.setdefault("batch_size", "your DataLoader takes a batch_sampler: it makes the batches")
            cfg.record_own(own)
        cfg.record_reach("torch:loader")
        if yours.get("batch_sampler") is not None:
            knobs.pop("batch_size", None)
        out = over_loader_kwargs(yours, loader_kwargs(knobs))
        if knobs.get("padding_free"):
            from torch.utils.data import default_collate

            from autotune.knobs._lm import Flattening

            out["collate_fn"] = Flattening(yours.get("collate_fn") or default_collate)
        return out

    def _optimizer_init(self, init, optimizer, *args, **kwargs):
        if not self._takes("prepare") or self.building:  # AdamW's __init__ runs Adam's: the outermost one's
            return init(optimizer, *args, **kwargs)
        self.building = True
        try:
            return self._fused_init(init, optimizer, *args, **kwargs)
        finally:
            self.building = False

    def _fused_init(self, init, optimizer, *args, **kwargs):
        bound = inspect.signature(init).bind(optimizer, *args, **kwargs)
        own_fused = bool(bound.arguments.get("fused"))
        if not self.sizes:  # the first optimizer's own value (before its base __init__ records it)
            self.cfg.record_own({"fused_optimizer": own_fused})
        self.cfg.record_reach("torch:optimizer")
        if bound.arguments.get("fused") is not None:
            self.cfg.cannot.setdefault("fused_optimizer", "your optimizer sets `fused=` itself")
        fused = self.cfg.knobs.get("fused_optimizer")
        if fused is not None and bound.arguments.get("fused") is None:
            kwargs = {**kwargs, "fused": bool(fused), **({"foreach": None} if fused else {})}  # exclusive
        return init(optimizer, *args, **kwargs)

    def _zero_grad(self, zero_grad, owner, set_to_none: bool = True):
        if not self._takes("zero_grad"):
            return zero_grad(owner, set_to_none)
        if "set_to_none" not in self.cfg.own:
            self.cfg.record_own({"set_to_none": bool(set_to_none)})
            self.cfg.record_reach("torch:zero_grad")
        return zero_grad(owner, self.cfg.knobs.get("set_to_none", set_to_none))

    def _ddp_init(self, init, ddp, *args, **kwargs):
        if not self._takes("wrap"):
            return init(ddp, *args, **kwargs)
        bound = inspect.signature(init).bind(ddp, *args, **kwargs)
        defaults = {
            n: p.default for n, p in inspect.signature(init).parameters.items() if p.default is not inspect._empty
        }
        own = {k: bound.arguments.get(kw, defaults.get(kw)) for k, kw in DDP_KNOBS.items()}
        self.cfg.record_own({k: v for k, v in own.items() if v is not None})
        self.cfg.record_reach("torch:ddp")
        kwargs = {**kwargs, **{kw: self.cfg.knobs[k] for k, kw in DDP_KNOBS.items() if k in self.cfg.knobs}}
        return init(ddp, *args, **kwargs)

    def _fully_shard(self, fully_shard, module, *args, **kwargs):
        if self._takes("wrap"):
            own = kwargs.get("reshard_after_forward", True)
            if "fsdp_reshard_after_forward" not in self.cfg.own:
                self.cfg.record_own({"fsdp_reshard_after_forward": own})
            self.cfg.record_reach("torch:fsdp")
            if "fsdp_reshard_after_forward" in self.cfg.knobs:
                kwargs = {**kwargs, "reshard_after_forward": self.cfg.knobs["fsdp_reshard_after_forward"]}
        return fully_shard(module, *args, **kwargs)


def _eager(hook):
    """A hook that runs outside any compiled graph (the step's counts are Python's, not the graph's)."""
    import torch

    return torch.compiler.disable(hook)


def _fused_optimizers() -> list[type]:
    """torch's optimizer classes that take `fused=`."""
    import torch

    out = []
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer:
            if "fused" in inspect.signature(cls.__init__).parameters and "__init__" in cls.__dict__:
                out.append(cls)
    return out


def _add(a, b):
    """Two counts' sum; None where either is unknown."""
    return None if a is None or b is None else a + b


_hooks: TorchHooks | None = None


def install(module=None) -> TorchHooks:
    """torch's instrumentation for this process's config, once (`module`: torch, as the finder hands it over)."""
    global _hooks
    if _hooks is None:
        from autotune.instrument import config

        _hooks = TorchHooks(config())
        _hooks.install()
    return _hooks


def uninstall() -> None:
    global _hooks
    if _hooks is not None:
        _hooks.uninstall()
        _hooks = None


def fully_shard(module) -> None:
    """The FSDP2 module, as the finder hands it over once the program imports it."""
    install().fully_shard(module)
