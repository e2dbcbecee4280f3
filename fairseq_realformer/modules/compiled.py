"""``--compile-layers``: every encoder and decoder layer's training forward compiled with
``torch.compile``, so that a GPU step launches a few generated kernels per layer instead of one
per operation, from far less Python. fairseq's Transformer has no such switch.

Compiled regionally, layer by layer (as fairseq2 and Hugging Face's trainers do), not the whole
model: fairseq's encoder and decoder loops, the loss and the optimizer stay as they are, and the
graphs are small. One compiled function per layer class (``COMPILED``), called with the layer as
its first argument: dynamo keeps its graphs on that function's code and treats a layer's
parameters as graph inputs, so every layer of a kind runs the same graphs. A layer's depth is an
argument, not a guard: a model compiles 5 graphs, its encoder's first layer (nothing carried in
yet) and the others, its decoder's first, the others and the alignment layer (which also
returns its probabilities). They are compiled with dynamic shapes from the first batch, so that
every later batch shape reuses them; a batch of one sentence compiles them once more (PyTorch
specialises sizes of 1). So that nothing else multiplies them, the stacks pass their padding
masks even where nothing is padded, and the decoder its future mask as a tensor of its own
(``models/realformer.py``). The parameters stay where they are, under their names: a checkpoint
of a compiled run is an ordinary checkpoint, and loads either way.

Compiled only where a training step runs (``runs_compiled``): the module in training mode with
gradients on. Validation, decoding (its incremental state changes every step), ``need_weights``
and the analysis tool's capture (both in eval mode) and ADMIN's profiling pass (which reads
statistics out of the forward) run eager. Under ``--checkpoint-activations`` the layers run eager
too: fairseq's checkpoint wrapper replaces the layer's forward with its own autograd Function.

On a CPU compiled layers train slower than eager ones (benchmarks/RESULTS.md, "Compiled
layers"): the switch is off by default everywhere until a GPU run says otherwise.
"""

import atexit
import logging
import os
import time
from typing import Callable, Dict, Optional

import torch

logger = logging.getLogger(__name__)

COMPILED: Dict[type, Callable] = {}  # layer class -> its forward, compiled


def _settings() -> Dict[str, str]:
    """torch.compile's backend and mode: inductor's default, unless REALFORMER_COMPILE_BACKEND
    (e.g. ``eager``: dynamo's tracing alone, to tell a tracing problem from one of generated code)
    or REALFORMER_COMPILE_MODE (e.g. ``reduce-overhead``: CUDA graphs) say otherwise."""
    settings = {"backend": os.environ.get("REALFORMER_COMPILE_BACKEND", "inductor")}
    mode = os.environ.get("REALFORMER_COMPILE_MODE")
    return {**settings, "mode": mode} if mode else settings


def compiled_forward(layer_class: type) -> Callable:
    """*layer_class*'s ``forward``, compiled once per process for every layer of that class."""
    if layer_class not in COMPILED:
        COMPILE_TIME.watch()
        # dynamic from the first batch: batch and sentence lengths vary every step
        COMPILED[layer_class] = torch.compile(layer_class.forward, dynamic=True, **_settings())
    return COMPILED[layer_class]


def runs_compiled(layer) -> bool:
    """Whether this call of *layer* takes its compiled forward: a training step (see above)."""
    return layer.compiles and layer.training and torch.is_grad_enabled() and layer.admin_profiler is None


def stack_runs_compiled(layers) -> bool:
    """Whether a stack's layers run compiled in this pass. Its padding masks are then passed even
    where nothing is padded (no-ops, the same numbers): fewer graphs, and no host sync."""
    return len(layers) > 0 and runs_compiled(layers[0])


class CompileTime:
    """What compiling took in this process: compilations (a forward graph traced by dynamo, with
    its backward; or a backward compiled later, at its first use) and their wall time. Read by
    ``report`` (the training log, once) and the benchmarks."""

    def __init__(self):
        self.graphs = 0
        self.seconds = 0.0
        self.reported = False
        self._started: Optional[float] = None
        self._watching = False

    def watch(self) -> None:
        """Count from now on (dynamo's compile callbacks; once)."""
        if self._watching:
            return
        self._watching = True
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)
        atexit.register(self.report)  # a run that never validates (--disable-validation) reports at its end

    def _start(self, *_) -> None:  # (CallbackArgs in newer PyTorch, nothing in older)
        self._started = time.perf_counter()

    def _end(self, *_) -> None:
        if self._started is None:
            return
        self.seconds += time.perf_counter() - self._started
        self._started = None
        self.graphs += 1
        if self.reported:  # after the first report every later compilation is worth a line
            logger.info(f"--compile-layers: compiled again ({self.summary()})")

    def summary(self) -> str:
        return f"{self.graphs} graphs compiled in {self.seconds:.1f} s"

    def report(self) -> None:
        """Log what compiling cost so far, once: when training first stops for validation, or at
        the end of a run that never does."""
        if self.reported or self.graphs == 0:  # nothing compiled yet: a later validation reports
            return
        self.reported = True
        logger.info(f"--compile-layers: {self.summary()} so far")


COMPILE_TIME = CompileTime()
