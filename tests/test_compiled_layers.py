"""--compile-layers (fairseq_realformer/modules/compiled.py): a compiled training step computes what
the eager one computes, on every backbone, mode and value residual, with a few graphs per layer
kind and no graph break; validation, decoding and ADMIN's profiling run eager; checkpoints keep
their keys. The steps are measured by tests.compiled_steps, beside the rest of the suite."""

import json
import os
import sys

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_realformer.modules import admin
from fairseq_realformer.optim import precision

from . import compiled_steps
from .background import Job
from .compiled_steps import BATCHES, DICTIONARY, graphs, pair, random_batch, realformer, train_step
from .helpers import BACKBONES, MODES, REPO, VALUE_RESIDUAL, model_sums, rounding


def measure(job):
    """tests.compiled_steps in a process of its own, with an inductor cache of its own: a cache
    kept from another run may hold kernels compiled for other vector instructions (inductor
    follows ATEN_CPU_CAPABILITY, its cache key does not: reused, they gave NaN losses or corrupted
    the heap)."""
    out = job.folder / "steps.json"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(job.folder / "inductor")}
    result = job.run([sys.executable, "-m", "tests.compiled_steps", str(out)], cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


# a few minutes of tracing and compiling, one thread: beside the rest of the suite (tests/background.py)
STEPS = Job(measure)
BACKGROUND = [STEPS]
RUN_SECONDS = 200  # on 2 busy cores (2026-11-27), nearly all of it STEPS: tests/conftest.py starts it early
# the layers of a kind share graphs: with 3 layers a stack, one graph for its first layer (nothing
# carried in), one for the others, and one more for the decoder's alignment layer (it returns its
# probabilities)
GRAPHS = 5


@pytest.fixture(scope="module")
def measured():
    return STEPS.result()


# float32's rounding (tests.helpers.rounding) of the step: the loss through the model, log_softmax
# and the mean over a batch's logits (at most 4 x 7 tokens of the 24 words); a gradient, relative
# to its norm, through the model and back
WORDS = len(DICTIONARY)
LOSS_SUMS = [*model_sums(), WORDS, max(len(src) * max(tgt) for src, tgt in BATCHES) * WORDS]
GRADIENT_ROUNDING = rounding(*model_sums(), *model_sums(), WORDS)


def assert_same_step(step):
    """The loss and every gradient to float32's rounding; those that are zero in exact
    arithmetic within it of the largest gradient, in both (tests.compiled_steps.compare)."""
    assert step["loss"] <= rounding(*LOSS_SUMS, scale=step["loss_size"]), step["loss"]
    assert step["same_parameters"]
    for measured in ("gradients", "zero_gradients"):
        worst = max(step[measured], key=step[measured].get)
        assert step[measured][worst] <= GRADIENT_ROUNDING, worst


@pytest.mark.parametrize("value_residual", VALUE_RESIDUAL)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backbone", BACKBONES)
def test_a_traced_training_step_computes_the_eager_one(measured, backbone, mode, value_residual):
    step = measured["traced"][f"{backbone}-{mode}-{value_residual}"]
    assert_same_step(step)
    assert step["graphs"] == GRAPHS and step["breaks"] == 0


def test_inductors_code_computes_the_eager_step_on_every_batch(measured):
    for step in measured["inductor"]["steps"]:
        assert_same_step(step)


def test_new_batch_shapes_reuse_the_graphs_without_a_break(measured):
    inductor = measured["inductor"]
    assert [step["graphs"] for step in inductor["steps"]] == [GRAPHS] * len(BATCHES)
    assert inductor["breaks"] == 0
    # what the training log reports: every graph compiled, and the time it took
    assert inductor["compile_time"]["graphs"] == GRAPHS and inductor["compile_time"]["seconds"] > 0


@pytest.fixture
def traced(monkeypatch):
    """In this process: dynamo's tracing alone (seconds), no graph kept from before or after."""
    monkeypatch.setenv("REALFORMER_COMPILE_BACKEND", "eager")
    compiled_steps.fresh_compiler()
    yield
    compiled_steps.fresh_compiler()


def test_validation_and_decoding_run_eager(traced):
    eager, compiled_model = pair()
    train_step(compiled_model, BATCHES[0], seed=0)
    assert graphs() == GRAPHS
    src, lengths, prev = random_batch(DICTIONARY, *BATCHES[1], seed=5)
    for model in (eager, compiled_model):
        model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled_model(src, lengths, prev)[0], eager(src, lengths, prev)[0], rtol=0, atol=0)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    translations = [
        [
            [h["tokens"].tolist() for h in hypotheses]
            for hypotheses in SequenceGenerator([m], DICTIONARY, beam_size=2).forward(sample)
        ]
        for m in (eager, compiled_model)
    ]
    assert translations[0] == translations[1]
    assert graphs() == GRAPHS  # nothing more compiled


def test_a_compiled_models_checkpoint_is_an_ordinary_one(traced):
    eager, compiled_model = pair()
    train_step(compiled_model, BATCHES[0], seed=0)
    assert list(compiled_model.state_dict()) == list(eager.state_dict())
    realformer().load_state_dict(compiled_model.state_dict())  # strict: every key, nothing more
    compiled_model.load_state_dict(realformer().state_dict())


def test_admin_profiling_runs_eager_and_sets_the_same_omega(traced):
    src, lengths, prev = random_batch(DICTIONARY, *BATCHES[0])
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    omegas = []
    for flags in ([], ["--compile-layers"]):
        model = realformer("all", "mean", "admin", "--admin-init", "profile", *flags).train()
        admin.initialize(model, net_input)
        omegas.append([p.detach().clone() for n, p in model.named_parameters() if n.endswith("_omega")])
    assert graphs() == 0  # the profiling pass compiled nothing
    assert len(omegas[0]) == 15 and all(torch.equal(a, b) for a, b in zip(*omegas))
    train_step(model, BATCHES[0], seed=0)  # and training after it runs compiled
    assert graphs() == GRAPHS


def test_layerdrop_and_bf16_steps_trace_as_they_run_eager(traced):
    """LayerDrop (which layers run is drawn outside the layers, each run one passes its depth) and
    --bf16's autocast: the traced step computes the eager one, with no graph break."""
    layerdrop = [
        "--encoder-layers",
        "4",
        "--decoder-layers",
        "4",
        "--encoder-layerdrop",
        "0.5",
        "--decoder-layerdrop",
        "0.5",
    ]
    eager, compiled_model = pair(*layerdrop)
    for seed in range(3):  # three draws of the layers that run
        torch.manual_seed(seed)
        loss, grads = train_step(eager, BATCHES[0], seed)
        torch.manual_seed(seed)
        compiled_loss, compiled_grads = train_step(compiled_model, BATCHES[0], seed)
        assert compiled_loss == loss and all(torch.equal(compiled_grads[n], g) for n, g in grads.items())
    eager, compiled_model = pair()
    with precision.autocast("cpu"):
        loss, grads = train_step(eager, BATCHES[0], seed=0)
        compiled_loss, compiled_grads = train_step(compiled_model, BATCHES[0], seed=0)
    assert compiled_loss == loss and all(torch.equal(compiled_grads[n], g) for n, g in grads.items())
    assert compiled_steps.graph_breaks() == 0


def test_under_activation_checkpointing_the_layers_run_eager_and_say_why(caplog):
    model = realformer("all", "mean", "admin", "--compile-layers", "--checkpoint-activations")
    assert not any(layer.compiles for layer in [*model.encoder.layers, *model.decoder.layers])
    assert "--compile-layers: the layers run eager under --checkpoint-activations" in caplog.text
