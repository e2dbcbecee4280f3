"""What tests/test_compiled_layers.py asserts on, measured in a process of its own: beside the rest
of the suite (tests/background.py), and with no dynamo state shared with other tests.

    python -m tests.compiled_steps OUT.json

For each backbone × mode × value residual, a training step of a tiny model compiled with dynamo's
tracing alone (REALFORMER_COMPILE_BACKEND=eager: which graphs, and the guards that choose one for
each layer, without generating code) against the same step eager; then one model through
inductor's generated code, as users run it, over batches of new shapes."""

import json
import os
import sys

import torch
from torch._dynamo.utils import counters

from fairseq_realformer.modules import compiled

from .helpers import BACKBONES, MODES, VALUE_RESIDUAL, make_dictionary, perturb_, random_batch, realformer

# padded sources and targets; nothing padded; new lengths and batch size (shapes vary every step)
BATCHES = [([5, 3, 4], [4, 5, 2]), ([2, 9], [4, 4]), ([6, 6, 2, 3], [3, 7, 7, 1])]
DICTIONARY = make_dictionary()
INDUCTOR_FLAGS = ["--value-residual-paths", "all", "--value-residual-mix", "learned"]


def fresh_compiler():
    """No graph from before: dynamo keeps them per function, for the whole process."""
    torch._dynamo.reset()
    counters.clear()
    compiled.COMPILED.clear()


def pair(*flags, backbone="admin", mode="mean"):
    """An eager model (perturbed away from its initialisation) and the same weights with
    --compile-layers, dropout 0 (tests/helpers.py's tiny 3+3 layers)."""
    eager = perturb_(realformer("all", mode, backbone, *flags))
    compiled_model = realformer("all", mode, backbone, "--compile-layers", *flags)
    compiled_model.load_state_dict(eager.state_dict())
    return eager, compiled_model


def train_step(model, batch, seed):
    """One forward and backward in training mode: the loss and every parameter's gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    src, lengths, prev = random_batch(DICTIONARY, *batch, seed=seed)
    out, _ = model(src, lengths, prev)
    loss = torch.nn.functional.log_softmax(out, dim=-1).mean()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def compare(eager, compiled_model, batch, seed):
    """The step's loss difference (and the loss's size); each gradient's difference relative to its norm; and the
    gradients that are zero in exact arithmetic, k_proj's biases (softmax ignores a shift of a
    row, also of the carried scores), relative to the largest gradient's norm: rounding noise in
    both, whose difference says nothing."""
    loss, grads = train_step(eager, batch, seed)
    compiled_loss, compiled_grads = train_step(compiled_model, batch, seed)
    largest = max(g.norm().item() for g in grads.values())
    zero = [name for name in grads if name.endswith("k_proj.bias")]
    return {
        "loss": abs(compiled_loss.item() - loss.item()),
        "loss_size": abs(loss.item()),
        "same_parameters": sorted(compiled_grads) == sorted(grads),
        "gradients": {
            name: (compiled_grads[name] - grad).norm().item() / grad.norm().item()
            for name, grad in grads.items()
            if name not in zero
        },
        "zero_gradients": {
            name: max(grads[name].norm().item(), compiled_grads[name].norm().item()) / largest for name in zero
        },
    }


def graphs():
    return counters["stats"]["unique_graphs"]


def graph_breaks():
    return sum(counters["graph_break"].values())


def traced_matrix():
    """Every backbone × mode × value residual, one step each (3+3 layers, so that two layers of a
    stack share the graph of the layers after the first)."""
    os.environ["REALFORMER_COMPILE_BACKEND"] = "eager"
    found = {}
    for backbone in BACKBONES:
        for mode in MODES:
            for value_residual, flags in VALUE_RESIDUAL.items():
                fresh_compiler()
                eager, compiled_model = pair(*flags, backbone=backbone, mode=mode)
                step = compare(eager, compiled_model, BATCHES[0], seed=0)
                found[f"{backbone}-{mode}-{value_residual}"] = {**step, "graphs": graphs(), "breaks": graph_breaks()}
    del os.environ["REALFORMER_COMPILE_BACKEND"]
    return found


def through_inductor():
    """One model (RealFormer on ADMIN, mean, learned value residual) through inductor, batch
    after batch: each step against eager, and the graphs compiled so far."""
    fresh_compiler()
    eager, compiled_model = pair(*INDUCTOR_FLAGS)
    steps = []
    for seed, batch in enumerate(BATCHES):
        steps.append({**compare(eager, compiled_model, batch, seed), "graphs": graphs()})
    return {
        "steps": steps,
        "breaks": graph_breaks(),
        "compile_time": {"graphs": compiled.COMPILE_TIME.graphs, "seconds": compiled.COMPILE_TIME.seconds},
    }


if __name__ == "__main__":
    result = {"traced": traced_matrix(), "inductor": through_inductor()}
    with open(sys.argv[1], "w") as out:
        json.dump(result, out, indent=1)
