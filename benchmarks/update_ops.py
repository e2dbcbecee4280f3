"""benchmarks/train_update.py's instrument: fairseq-train's update, its ATen ops counted and its host
time taken by phase from inside ``Trainer.train_step`` (the phases: train_update.py's help), and
fairseq-train run under it, in this process (tests/test_update_ops.py) or as train_update's ``--child``."""

import collections
import contextlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

PHASES = ("forward", "loss", "backward", "grad_norm", "optimizer", "rest")


class Phases:
    """Which phase of one ``train_step`` runs now, and what each phase cost: ATen ops counted
    into the phase on top of the stack, host seconds charged to it exclusively (a phase inside
    another, the forward inside the loss, pauses the outer one's clock). The root is ``rest``."""

    def __init__(self):
        self.stack = ["rest"]
        self.ops = collections.Counter()  # ops that compute: no views, no profiler marks
        self.all_ops = collections.Counter()  # every op dispatched
        self.op_names = collections.defaultdict(collections.Counter)
        self.seconds = collections.defaultdict(float)
        self.mark = time.perf_counter()

    def charge(self):  # the time since the last mark, to the phase on top
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.mark
        self.mark = now

    def enter(self, phase):
        self.charge()
        self.stack.append(phase)

    def leave(self):
        self.charge()
        if len(self.stack) > 1:
            self.stack.pop()


def computes(func) -> bool:
    """Whether ATen op *func* is one that does work: not a view (``view``, ``t``, ``detach``: what
    ``p.grad.data`` dispatches), not the profiler's ``record_function`` marks around fairseq's
    phases. ``Phases.all_ops`` counts those too."""
    return not (func.is_view or func.overloadpacket.__name__.startswith("_record_function"))


def op_counter(phases):
    """A TorchDispatchMode that counts every ATen op dispatched while it is on into *phases*
    (by phase and by op; ``computes``). Ops a multi-tensor op runs inside itself are not
    dispatched again. A ``torch.compile``d region runs compiled under it (dynamo runs eager
    under a mode that does not ignore compile internals), and what its compiled code dispatches
    (inductor's extern kernels: matrix products, ...) is counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):  # compiled code runs compiled: its own dispatches counted
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            phase = phases.stack[-1]
            phases.all_ops[phase] += 1
            if computes(func):
                phases.ops[phase] += 1
                phases.op_names[phase][str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


class Instrument:
    """What fairseq's ``Trainer.train_step`` did under ``fairseq_train_in_process``: the updates in
    *count* ran under ``op_counter``, those in *time* were timed by phase, and every update's own
    wall time is kept. An update is numbered from 1, as fairseq's log numbers it."""

    def __init__(self, count=(), time=()):
        self.count, self.time = set(count), set(time)
        self.counted = {}  # update -> {"ops": {phase: n}, "op_names": {phase: {op: n}}}
        self.timed = {}  # update -> {phase: ms, "total": ms}
        self.update_ms = {}  # update -> ms of its train_step, every update
        self.first_step_start = self.last_step_end = None
        self.tensors = None  # the optimizer's parameter tensors
        self._current = None  # the running update's Phases, where it is counted or timed

    # the phases' wrappers, installed on the trainer's own objects at its first update
    def _wrap(self, owner, name, phase):
        function = getattr(owner, name)

        def wrapped(*args, **kwargs):
            if self._current is None:
                return function(*args, **kwargs)
            self._current.enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self._current.leave()

        setattr(owner, name, wrapped)

    def _hooks(self, module, phase):
        module.register_forward_pre_hook(lambda *_: self._current and self._current.enter(phase))
        module.register_forward_hook(lambda *_: self._current and self._current.leave())

    def _instrument(self, trainer):
        if getattr(trainer, "_train_update_instrumented", False):
            return
        trainer._train_update_instrumented = True
        optimizer = trainer.optimizer  # built now if not yet, as train_step would
        self.tensors = len(list(optimizer.params))
        self._hooks(trainer.criterion, "loss")
        self._hooks(trainer.model, "forward")
        self._wrap(optimizer, "backward", "backward")
        self._wrap(trainer, "clip_grad_norm", "grad_norm")
        self._wrap(trainer.task, "optimizer_step", "optimizer")

    def train_step(self, original, trainer, samples, raise_oom=False):
        """fairseq's *original* ``train_step`` of *trainer*, instrumented."""
        self._instrument(trainer)
        update = trainer.get_num_updates() + 1
        counting, timing = update in self.count, update in self.time
        phases = self._current = Phases() if counting or timing else None
        start = time.perf_counter()
        if self.first_step_start is None:
            self.first_step_start = start
        try:
            with op_counter(phases) if counting else contextlib.nullcontext():
                return original(trainer, samples, raise_oom)
        finally:
            self._current = None
            end = self.last_step_end = time.perf_counter()
            self.update_ms[update] = 1e3 * (end - start)
            if counting:
                self.counted[update] = {
                    "ops": {p: phases.ops.get(p, 0) for p in PHASES},
                    "all_ops": {p: phases.all_ops.get(p, 0) for p in PHASES},
                    "op_names": {p: dict(phases.op_names[p].most_common(8)) for p in PHASES if phases.ops.get(p)},
                }
            elif timing:
                phases.charge()
                self.timed[update] = {p: 1e3 * phases.seconds.get(p, 0.0) for p in PHASES}
                self.timed[update]["total"] = 1e3 * (end - start)

    def summary(self):
        """Ops per update by phase (mean over the counted updates) with their total, host ms per
        phase (median over the timed updates), every update's ms, the seconds from the first
        update's start to the last one's end."""
        result = {"tensors": self.tensors}
        if self.counted:
            for kind in ("ops", "all_ops"):
                ops = {p: statistics.mean(c[kind][p] for c in self.counted.values()) for p in PHASES}
                result[kind] = {**ops, "total": sum(ops.values())}
            result["op_names"] = self.counted[max(self.counted)]["op_names"]
        if self.timed:
            result["ms"] = {p: statistics.median(t[p] for t in self.timed.values()) for p in (*PHASES, "total")}
        result["counted_updates"] = sorted(self.counted)
        result["timed_updates"] = sorted(self.timed)
        result["update_ms"] = {str(u): round(ms, 3) for u, ms in sorted(self.update_ms.items())}
        if self.first_step_start is not None:
            result["train_s"] = self.last_step_end - self.first_step_start
        return result


def fairseq_train_in_process(argv, instrument):
    """fairseq-train *argv* in this process (``fairseq_cli.train.cli_main``), its ``Trainer.train_step``
    under *instrument*; the instrument's summary."""
    # fairseq_cli.train first: it sets the log's format, "| train_inner |" (what train_update reads);
    # importing fairseq before it gives Python's default format (a speech task calls basicConfig)
    from fairseq_cli import train

    original = train.Trainer.train_step

    def train_step(trainer, samples, raise_oom=False):
        return instrument.train_step(original, trainer, samples, raise_oom)

    with mock.patch.object(train.Trainer, "train_step", train_step):
        with mock.patch.object(sys, "argv", ["fairseq-train", *map(str, argv)]):
            train.cli_main()
    return instrument.summary()


def child(spec_path):
    """The runner: one fairseq-train run as the spec (JSON) says; its measurements into the spec's
    ``out``. fairseq's baseline (no --user-dir) never imports the plugin."""
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("cudnn_off"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    instrument = Instrument(count=spec["count"], time=spec["time"])
    summary = fairseq_train_in_process(spec["argv"], instrument)
    summary["plugin_imported"] = "fairseq_realformer" in sys.modules
    compiled = sys.modules.get("fairseq_realformer.modules.compiled")
    if compiled is not None:
        summary.update(compile_s=compiled.COMPILE_TIME.seconds, graphs=compiled.COMPILE_TIME.graphs)
    summary["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        summary["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()
    summary["threads"] = torch.get_num_threads()
    Path(spec["out"]).write_text(json.dumps(summary))
