"""The models and schedules the studies train (quality.py --preset), defined once: the quality
study, the bf16 and the compiled-layers benchmarks train the same CPU model. TRAINING: the flags
that every fairseq-train of the harness is given alike (its batches made in its own process, its
log in JSON lines)."""

from dataclasses import dataclass

TRAINING = tuple(
    "--share-all-embeddings --optimizer adam --adam-betas (0.9,0.98) --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1 --num-workers 0 --log-format json".split()
)


@dataclass(frozen=True)
class Preset:
    epochs: int
    layers: int = None  # None: the recipe's
    lr: float = None  # None: the recipe's Adam 5e-4, inverse-sqrt warm-up 1000
    warmup: int = None
    linear_decay: bool = False  # polynomial_decay to 0 at the end of the last epoch
    model: tuple = ()
    describe: str = ""
    recipe: tuple = ()  # the recipe's own flags for this preset (run.sh --published)

    def model_flags(self) -> list:
        """fairseq-train's flags for this preset's model: its layers and widths."""
        return ["--encoder-layers", str(self.layers), "--decoder-layers", str(self.layers), *self.model]


PRESETS = {
    "gpu": Preset(epochs=12, describe="6+6 layers, d=512, FFN 1024"),
    "cpu": Preset(
        epochs=20,
        layers=4,
        lr=2e-3,
        warmup=400,
        linear_decay=True,
        model=tuple(
            "--encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 256 "
            "--decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4".split()
        ),
        describe="4+4 layers, d=128, FFN 256",
    ),
    "quick": Preset(epochs=2, layers=2, describe="--quick (recipe --tiny: 300 lines, d=32)"),
    # the recipe sets the model and the schedule; no epoch limit (at most 8,000 updates, patience 10)
    "published": Preset(
        epochs=0,
        describe="the published recipe (Wu et al. 2021): lowercased Moses-tokenised text, joint BPE 10k, "
        "4+4 layers, d=128, FFN 256, Adam 5e-3, 8,192 tokens an update, at most 8,000 updates, patience 10",
        recipe=("--published",),
    ),
}
