"""Tiny models and batches for the tests, built through fairseq's own argument parser."""

import os
from typing import Sequence

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_realformer

USER_DIR = os.path.dirname(os.path.abspath(fairseq_realformer.__file__))
REPO = os.path.dirname(USER_DIR)

EMBED, FFN, HEADS, LAYERS = 16, 32, 2, 3
TINY = (
    f"--encoder-embed-dim {EMBED} --encoder-ffn-embed-dim {FFN} --encoder-attention-heads {HEADS} "
    f"--encoder-layers {LAYERS} --decoder-embed-dim {EMBED} --decoder-ffn-embed-dim {FFN} "
    f"--decoder-attention-heads {HEADS} --decoder-layers {LAYERS} --dropout 0 --attention-dropout 0 "
    "--activation-dropout 0"
).split()


def rounding(*sums: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> float:
    """How far two computations of one value in *dtype* may differ when the CPU's kernels add in
    another order (AVX2, AVX-512 or AMX vector widths, another blocking, more threads): through a
    chain of sums of *sums* terms each, of values of size *scale*, ε·(Σ sums)·scale. A sum of n
    products rounds by at most γ_n·Σ|x·y| ≈ n·(ε/2)·Σ|x·y| (Higham, Accuracy and Stability of
    Numerical Algorithms, §3.1); two orders, twice that. One CPU's difference is far smaller (the
    roundings cancel, about √n of them), so a tolerance tuned to it fails on another CPU."""
    return torch.finfo(dtype).eps * sum(sums) * float(torch.as_tensor(scale).detach())


def model_sums(layers: int = LAYERS, length: int = 10, embed: int = EMBED, ffn: int = FFN, heads: int = HEADS):
    """The sums along the longest path through a tiny model, from the embeddings to the logits,
    with sentences of up to *length* tokens: in each attention the projections, scores, softmax,
    weighted sum, output projection and LayerNorm; in each FFN its two projections and LayerNorm;
    the carried scores, one term a layer; the output projection."""
    attention = [embed, embed // heads, length, length, embed, embed, layers]
    ffn_sums = [embed, ffn, embed]
    return layers * (attention + ffn_sums) + layers * (2 * attention + ffn_sums) + [embed]


def assert_within_rounding(got, want, layers=LAYERS, *sums):
    """*got* is *want* to float32's rounding through a model of *layers* layers (and *sums* after it)."""
    atol = rounding(*model_sums(layers), *sums, scale=want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


def differs_beyond_rounding(got, want, layers=LAYERS):
    """*got* is not *want*, by more than float32's rounding through the model."""
    return (got - want).abs().max() > rounding(*model_sums(layers), scale=want.abs().max())


PATH_SETS = ["none", "encoder", "decoder", "cross", "encoder,decoder", "encoder,cross", "decoder,cross", "all"]
MODES = ["sum", "mean"]
BACKBONES = ["post-ln", "pre-ln", "admin", "deepnorm", "rezero", "t-fixup", "resi-dual"]
# value residual off, or on every path with either mix
VALUE_RESIDUAL = {
    "no-vr": [],
    "vr-half": ["--value-residual-paths", "all", "--value-residual-mix", "half"],
    "vr-learned": ["--value-residual-paths", "all", "--value-residual-mix", "learned"],
}


def value_residual_of(setting: str):
    """reference_forward's keyword arguments for a VALUE_RESIDUAL setting."""
    flags = VALUE_RESIDUAL[setting]
    return {"value_paths": paths_of(flags[1]), "value_mix": flags[3]} if flags else {}


def paths_of(spec: str):
    return {"none": set(), "all": {"encoder", "decoder", "cross"}}.get(spec, set(spec.split(",")))


def make_dictionary(n_words: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}")
    return d


class FakeTask:
    """What ``build_model`` reads from a translation task: its dictionaries."""

    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def parse_args(arch: str, *flags: str):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["/no/data", "--arch", arch, "--user-dir", USER_DIR, *TINY, *flags])


def build_model(arch: str = "realformer", *flags: str, dictionary=None, seed: int = 0):
    """A tiny model in eval mode, its parameters drawn from *seed*."""
    args = parse_args(arch, *flags)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, FakeTask(dictionary or make_dictionary()))
    return model.eval()


def realformer(paths: str = "all", mode: str = "mean", backbone: str = "admin", *flags, **kw):
    return build_model(
        "realformer",
        "--residual-attention-paths",
        paths,
        "--residual-attention-mode",
        mode,
        "--backbone",
        backbone,
        *flags,
        **kw,
    )


def perturb_(model, seed: int = 1, scale=None):
    """Move every parameter away from its initial value (biases 0, LN 1/0, ω constant, ReZero's
    α 0), so that no term of the computation hides behind a degenerate value. Default scale 0.3;
    0.1 for a backbone without LayerNorm, where 0.3 makes activations grow to ~10⁴ through the
    layers (and float32 rounding to ~10⁻²), far from anything training produces."""
    if scale is None:
        scale = 0.3 if getattr(getattr(model, "options", None), "layer_norm", True) else 0.1
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def random_batch(dictionary, lengths: Sequence[int], tgt_lengths: Sequence[int], seed: int = 0):
    """Left-padded sources and right-padded decoder inputs (fairseq's translation defaults)."""
    g = torch.Generator().manual_seed(seed)
    pad, eos, nspecial = dictionary.pad(), dictionary.eos(), dictionary.nspecial
    src = torch.full((len(lengths), max(lengths)), pad)
    for i, n in enumerate(lengths):
        src[i, max(lengths) - n :] = torch.randint(nspecial, len(dictionary), (n,), generator=g)
        src[i, -1] = eos
    prev = torch.full((len(tgt_lengths), max(tgt_lengths)), pad)
    for i, n in enumerate(tgt_lengths):
        prev[i, :n] = torch.randint(nspecial, len(dictionary), (n,), generator=g)
        prev[i, 0] = eos  # decoder input starts with EOS, as fairseq's collater builds it
    return src, torch.tensor(list(lengths)), prev


def layerdrop_draw(layers: int, p: float, wanted, seeds=range(50)):
    """The first seed whose LayerDrop draws (fairseq's LayerDropModuleList: one uniform per layer
    and pass, the encoder's, then the decoder's) keep layers for which *wanted(kept_encoder,
    kept_decoder)* holds: (seed, kept encoder layers, kept decoder layers)."""
    for seed in seeds:
        torch.manual_seed(seed)
        kept_enc = [i for i, u in enumerate(torch.empty(layers).uniform_()) if u > p]
        kept_dec = [i for i, u in enumerate(torch.empty(layers).uniform_()) if u > p]
        if wanted(kept_enc, kept_dec):
            return seed, kept_enc, kept_dec
    raise AssertionError(f"no seed of {seeds} draws the layers wanted")


def write_clinic_profile(path, encoder_omegas: Sequence[float], decoder_omegas: Sequence[float]) -> None:
    """ω in Transformer-Clinic's ``profile.ratio.init`` format (lines ``index ratio``, encoder
    sublayers from 1, then decoder sublayers from 1), as its profiling run writes them."""
    with open(path, "w") as f:
        for omegas in (encoder_omegas, decoder_omegas):
            for index, omega in enumerate(omegas, start=1):
                f.write(f"{index} {omega!r}\n")
