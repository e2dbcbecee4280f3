"""Every option of the plugin, in one place: its flag, choices, default and help; how it is
validated against fairseq's own flags; and what is derived from it.

``RealformerModel.build_model`` parses the flags once into a frozen ``RealformerOptions``, which
the layers, the attention modules and ADMIN read. Named architectures set their defaults through
``set_defaults`` and end with ``check``, which fairseq runs while it parses a command line, so a
mistake is refused before anything is built or written; ``add_args`` is generated from ``FLAGS``;
``scripts/average_checkpoints.py`` compares checkpoints on ``MODEL_FIELDS``. The backbones'
definitions are ``modules/backbones.py``: a new backbone is one entry there.
"""

import argparse
import os
from dataclasses import dataclass
from typing import FrozenSet, Optional

from .errors import RealformerConfigError
from .files.checkpoints import restore_file_path
from .modules.backbones import BACKBONES
from .modules.dense_residual import DENSE_RESIDUALS
from .modules.dense_residual import DILATION as DENSE_DILATION
from .modules.dense_residual import PERIOD as DENSE_PERIOD
from .modules.hyper_connections import MIXES as STREAM_MIXES
from .modules.hyper_connections import SINKHORN_ITERATIONS
from .modules.sublayers import PATHS  # the names --residual-attention-paths takes: encoder, decoder, cross

MODES = ("sum", "mean")
VALUE_MIXES = ("half", "learned")
ADMIN_INITS = ("closed-form", "profile")
STREAM_WEIGHTS = ("dynamic", "static")


@dataclass(frozen=True)
class Flag:
    """One command-line flag of the plugin. Its default is the RealFormer paper's NMT setting,
    applied by the architectures (``set_defaults``), so that flags on the command line win."""

    name: str
    default: object  # a string, or False for a switch
    help: str
    choices: Optional[tuple] = None
    metavar: Optional[str] = None
    # changes what the same parameters compute: checkpoints that differ in it are different models
    model_defining: bool = True
    switch: bool = False  # a flag without a value (store_const True; default False)

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")


FLAGS = (
    Flag(
        "--residual-attention-paths",
        "all",
        metavar="PATHS",
        help=f"score paths that carry residual attention: a comma list of {', '.join(PATHS)}; or all / none",
    ),
    Flag(
        "--residual-attention-mode",
        "mean",
        choices=MODES,
        help="sum: softmax over the running sum of scores S_n; mean: over S_n / n, "
        "n = attention layers traversed (the RealFormer paper's choice for NMT)",
    ),
    Flag(
        "--value-residual-paths",
        "none",
        metavar="PATHS",
        help=f"paths whose attention layers n >= 2 mix the first layer's values into their own "
        f"(ResFormer's value residual): a comma list of {', '.join(PATHS)}; or all / none",
    ),
    Flag(
        "--value-residual-mix",
        "half",
        choices=VALUE_MIXES,
        help="value residual V_n' = lambda*V_n + (1-lambda)*V_1; half: lambda = 1/2 (ResFormer); learned: "
        "lambda = sigmoid(x.w + b) per token and head, w and b zero at initialisation",
    ),
    Flag(
        "--backbone",
        "admin",
        choices=tuple(BACKBONES),
        help="; ".join(f"{name}: {backbone.formula}" for name, backbone in BACKBONES.items()),
    ),
    Flag(
        "--admin-init",
        "closed-form",
        choices=ADMIN_INITS,
        model_defining=False,
        help="how ADMIN's omega is initialised: closed-form: omega = sqrt((N+1)/ln(N+1) - 1), "
        "N = residual sublayers of the stack; profile: one forward pass on a training batch "
        "before the first update (the ADMIN paper's method; stored in the checkpoints)",
    ),
    Flag(
        "--admin-init-path",
        None,
        metavar="FILE",
        model_defining=False,
        help="initialise ADMIN's omega from a Transformer-Clinic profile.ratio.init before the "
        "first update (stored in the checkpoints; the file is not needed later)",
    ),
    Flag(
        "--residual-streams",
        "1",
        metavar="N",
        help="Hyper-Connections (Zhu et al. 2025) on --backbone pre-ln: N residual streams through each stack, "
        "every sublayer reading a learned mix of them and writing its output into each; 1: the backbone's "
        "own single residual stream (docs/residual-paths.md)",
    ),
    Flag(
        "--residual-streams-mix",
        "hc",
        choices=STREAM_MIXES,
        help="hc: the streams' read, mix and write weights as the Hyper-Connections paper has them; mhc: "
        "reads sigmoid, writes 2*sigmoid and the stream mix made doubly stochastic by Sinkhorn-Knopp (mHC, "
        "Xie et al. 2025)",
    ),
    Flag(
        "--residual-streams-weights",
        "dynamic",
        choices=STREAM_WEIGHTS,
        help="dynamic: the connection weights also depend on the streams, per token (the paper's DHC, its "
        "best); static: learned parameters only (SHC)",
    ),
    Flag(
        "--residual-streams-sinkhorn-iterations",
        str(SINKHORN_ITERATIONS),
        metavar="T",
        help=f"--residual-streams-mix mhc: Sinkhorn-Knopp iterations (column then row normalisations) per "
        f"stream mix ({SINKHORN_ITERATIONS}: the mHC paper's)",
    ),
    Flag(
        "--dense-residual",
        "none",
        choices=DENSE_RESIDUALS,
        help="dwa: DenseFormer's depth-weighted average (Pagliardini et al. 2024) after every layer of both "
        "stacks, a learned mix of the embedded input and every earlier layer's output, starting as the "
        "backbone; none: the backbone alone (docs/residual-paths.md)",
    ),
    Flag(
        "--dense-residual-dilation",
        str(DENSE_DILATION),
        metavar="K",
        help=f"--dense-residual dwa: the average after layer i weighs the outputs of layers i, i-K, i-2K, ... "
        f"(the embedded input as layer 0) ({DENSE_DILATION}: the DenseFormer paper's default; its 4x5: 4)",
    ),
    Flag(
        "--dense-residual-period",
        str(DENSE_PERIOD),
        metavar="P",
        help=f"--dense-residual dwa: average after every P-th layer only ({DENSE_PERIOD}: after every layer, "
        f"the paper's default; its 4x5: 5)",
    ),
    Flag(
        "--compile-layers",
        False,
        switch=True,
        model_defining=False,
        help="compile every encoder and decoder layer's training step with torch.compile (one compiled "
        "forward per layer kind, compiled at the first batches; validation, decoding and ADMIN's "
        "profiling run eager). Off by default: slower on CPUs; see docs/usage.md for GPUs",
    ),
    Flag(
        "--fairseq-update",
        False,
        switch=True,
        model_defining=False,
        help="step the optimizer, the gradient norm and --fp16's copies with fairseq's own code, one "
        "tensor at a time. Off by default: the plugin's models take one multi-tensor op per step of "
        "each, the same numbers (docs/usage.md)",
    ),
)

# Flags that are gone, each with what to do instead: refused in one line on a command line;
# checkpoints that stored them still load (the value is dropped).
RETIRED_FLAGS = {
    "--residual-attention-kernel": "retired: residual attention runs one implementation, the eager score "
    "chain (the fused and concat kernels were no faster on GPUs: benchmarks/RESULTS.md); for speed on a "
    "GPU, try --compile-layers",
}

# Model settings that change what the same parameters compute: fairseq's, then the plugin's.
MODEL_FIELDS = (
    "arch",
    "_name",
    "encoder_normalize_before",
    "decoder_normalize_before",
    *(flag.dest for flag in FLAGS if flag.model_defining),
)


# Set by ``add_args``, which fairseq calls only while parsing a command line (never when a
# checkpoint's saved args rebuild a model); ``check`` takes it off again.
_ON_COMMAND_LINE = "_realformer_on_command_line"


def add_args(parser: argparse.ArgumentParser) -> None:
    """The plugin's flags, without defaults: the architectures set them (``set_defaults``).
    Their values are checked by ``check``, not by argparse's ``choices``, whose refusal prints
    fairseq-train's whole usage (180 lines) before the one that matters."""
    for flag in FLAGS:
        if flag.switch:
            parser.add_argument(flag.name, action="store_const", const=True, help=flag.help)
            continue
        metavar = flag.metavar or (f"{{{','.join(flag.choices)}}}" if flag.choices else None)
        parser.add_argument(flag.name, metavar=metavar, help=flag.help)
    for name in RETIRED_FLAGS:
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.set_defaults(**{_ON_COMMAND_LINE: True})


def set_defaults(args, **overrides) -> None:
    """Fill in every plugin option *args* lacks (None): *overrides* (an architecture's own
    values, by dest), else the paper's NMT setting. Flags given on the command line win."""
    unknown = set(overrides) - {flag.dest for flag in FLAGS}
    if unknown:
        raise TypeError(f"not plugin options: {', '.join(sorted(unknown))}")
    for flag in FLAGS:
        if getattr(args, flag.dest, None) is None:
            setattr(args, flag.dest, overrides.get(flag.dest, flag.default))


def check(args) -> None:
    """Check every plugin flag of *args*, once its architecture has set the defaults (fairseq's
    too): every named architecture ends with this call. fairseq runs the architecture while it
    parses the command line, so fairseq-train stops with one line before it logs its config,
    loads data, builds the model or makes its save dir. On a command line, the Clinic file of
    ``--admin-init-path`` is read too (it exists and fits the depths), unless training resumes
    from a checkpoint, which carries ω (generation never needs the file)."""
    on_command_line = getattr(args, _ON_COMMAND_LINE, False)
    for name, instead in RETIRED_FLAGS.items():
        dest = name[2:].replace("-", "_")
        value = getattr(args, dest, None)
        if hasattr(args, dest):
            delattr(args, dest)  # an old checkpoint's value means nothing now: not saved again
        if on_command_line and value is not None:
            raise RealformerConfigError(f"{name} {value}: {instead}")
    options = RealformerOptions.from_args(args)
    if on_command_line:
        delattr(args, _ON_COMMAND_LINE)  # not a model setting: no checkpoint stores it
        if options.admin_init_path and not _loads_a_checkpoint(args):
            from .modules.admin import read_clinic_profile

            read_clinic_profile(options.admin_init_path, args.encoder_layers, args.decoder_layers)


def _loads_a_checkpoint(args) -> bool:
    """fairseq-train will start from a checkpoint: ``--restore-file`` (by default
    SAVE_DIR/checkpoint_last.pt) exists, or ``--finetune-from-model`` is given."""
    restore = getattr(args, "restore_file", None)
    if restore is not None:
        save_dir, suffix = getattr(args, "save_dir", "checkpoints"), getattr(args, "checkpoint_suffix", None)
        restore = restore_file_path(restore, save_dir, suffix)
    resumes = restore is not None and os.path.isfile(restore)
    return resumes or bool(getattr(args, "finetune_from_model", None))


def parse_paths(spec: str, flag: str = "--residual-attention-paths") -> FrozenSet[str]:
    """*flag*'s value: a comma list of encoder, decoder, cross; or all / none."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["all"]:
        return frozenset(PATHS)
    if names in ([], ["none"]):
        return frozenset()
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        raise RealformerConfigError(
            f"{flag}: unknown path {', '.join(map(repr, unknown))}; "
            f"give a comma list of {', '.join(PATHS)}, or all, or none"
        )
    return frozenset(names)


@dataclass(frozen=True)
class RealformerOptions:
    """The plugin's options of one model, validated, with what is derived from them."""

    paths: FrozenSet[str]  # score paths that carry residual attention
    running_mean: bool  # softmax over S_n / n instead of S_n
    backbone: str
    admin_init: str
    admin_init_path: Optional[str]
    value_paths: FrozenSet[str] = frozenset()  # paths with value residual
    value_mix: str = "half"
    compile_layers: bool = False  # training steps through compiled layers (modules/compiled.py)
    fast_update: bool = True  # fairseq-train's update as multi-tensor ops (optim/fast_update.py)
    residual_streams: int = 1  # n of Hyper-Connections; 1: none (modules/hyper_connections.py)
    residual_streams_mix: str = "hc"
    residual_streams_dynamic: bool = True  # DHC, else SHC
    sinkhorn_iterations: int = SINKHORN_ITERATIONS  # mHC's
    dense_residual: str = "none"  # "dwa": DenseFormer's depth-weighted averages (modules/dense_residual.py)
    dense_dilation: int = DENSE_DILATION
    dense_period: int = DENSE_PERIOD

    @property
    def normalize_before(self) -> bool:
        """LayerNorm before each sublayer (and after each stack) instead of after the sum."""
        return BACKBONES[self.backbone].layer_norm == "before"

    @property
    def layer_norm(self) -> bool:
        """The backbone has LayerNorms (before or after each sublayer)."""
        return BACKBONES[self.backbone].layer_norm is not None

    @property
    def admin_from_data(self) -> bool:
        """ADMIN's ω are set from data (a profiling pass or a Clinic file) before training."""
        return self._weight_from_data and (self.admin_init == "profile" or bool(self.admin_init_path))

    @property
    def _weight_from_data(self) -> bool:
        weight = BACKBONES[self.backbone].weight
        return weight is not None and weight.from_data

    @classmethod
    def from_args(cls, args) -> "RealformerOptions":
        """Parse and check the model's flags (fairseq's *args*, after the architecture set the
        defaults). Impossible combinations raise a one-line error naming the flags."""
        missing = [flag.name for flag in FLAGS if not hasattr(args, flag.dest)]
        if missing:
            raise RealformerConfigError(f"{', '.join(missing)} not set: build the model through its architecture")
        for flag in FLAGS:
            value = getattr(args, flag.dest)
            if flag.choices and value not in flag.choices:
                raise RealformerConfigError(f"{flag.name} {value}: choose from {', '.join(flag.choices)}")
        options = cls(
            paths=parse_paths(args.residual_attention_paths),
            running_mean=args.residual_attention_mode == "mean",
            backbone=args.backbone,
            admin_init=args.admin_init,
            admin_init_path=args.admin_init_path or None,
            value_paths=parse_paths(args.value_residual_paths, "--value-residual-paths"),
            value_mix=args.value_residual_mix,
            compile_layers=bool(args.compile_layers),
            fast_update=not args.fairseq_update,
            residual_streams=_whole_number(args.residual_streams, "--residual-streams"),
            residual_streams_mix=args.residual_streams_mix,
            residual_streams_dynamic=args.residual_streams_weights == "dynamic",
            sinkhorn_iterations=_whole_number(
                args.residual_streams_sinkhorn_iterations, "--residual-streams-sinkhorn-iterations"
            ),
            dense_residual=args.dense_residual,
            dense_dilation=_whole_number(args.dense_residual_dilation, "--dense-residual-dilation"),
            dense_period=_whole_number(args.dense_residual_period, "--dense-residual-period"),
        )
        options._check_against(args)
        return options

    def _check_against(self, args) -> None:
        if self.admin_init == "profile" and self.admin_init_path:
            raise RealformerConfigError("--admin-init profile and --admin-init-path exclude each other")
        if not self._weight_from_data and (self.admin_init == "profile" or self.admin_init_path):
            raise RealformerConfigError(
                f"--admin-init profile / --admin-init-path set ADMIN's omega, but --backbone is {self.backbone}"
            )
        # fairseq's flag for Pre-LN agrees with --backbone pre-ln; with any other it contradicts it
        if not self.normalize_before and (args.encoder_normalize_before or args.decoder_normalize_before):
            raise RealformerConfigError(
                f"--encoder-normalize-before/--decoder-normalize-before contradict --backbone "
                f"{self.backbone}; use --backbone pre-ln for a Pre-LN model"
            )
        if not self.layer_norm and getattr(args, "layernorm_embedding", False):
            raise RealformerConfigError(
                f"--layernorm-embedding adds a LayerNorm, but --backbone {self.backbone} has none"
            )
        if getattr(args, "cross_self_attention", False):
            raise RealformerConfigError(
                "--cross-self-attention is not supported by the realformer model: its decoder "
                "self-attention also attends over encoder states, which mixes the separate score paths"
            )
        for flag, paths in (("--residual-attention-paths", self.paths), ("--value-residual-paths", self.value_paths)):
            if "cross" in paths and getattr(args, "no_cross_attention", False):
                raise RealformerConfigError(f"{flag} includes cross, but --no-cross-attention removes it")
        if getattr(args, "base_layers", 0):
            raise RealformerConfigError("--base-layers is not supported by the realformer model")
        self._check_residual_streams()
        self._check_dense_residual(args)

    def _check_residual_streams(self) -> None:
        n = self.residual_streams
        if n > 1 and self.backbone != "pre-ln":
            raise RealformerConfigError(
                f"--residual-streams {n} needs --backbone pre-ln, not --backbone {self.backbone}: "
                f"Hyper-Connections are defined on Pre-LN"
            )
        chosen = [
            ("--residual-streams-mix", self.residual_streams_mix, "hc"),
            ("--residual-streams-weights", "dynamic" if self.residual_streams_dynamic else "static", "dynamic"),
            ("--residual-streams-sinkhorn-iterations", self.sinkhorn_iterations, SINKHORN_ITERATIONS),
        ]
        for flag, value, default in chosen:
            if n == 1 and value != default:
                raise RealformerConfigError(
                    f"{flag} {value} needs --residual-streams N >= 2: one stream is the backbone's own residual"
                )
        if self.residual_streams_mix == "hc" and self.sinkhorn_iterations != SINKHORN_ITERATIONS:
            raise RealformerConfigError(
                f"--residual-streams-sinkhorn-iterations {self.sinkhorn_iterations} needs "
                f"--residual-streams-mix mhc: hc's stream mix is not projected"
            )

    def _check_dense_residual(self, args) -> None:
        chosen = (("--dense-residual-dilation", self.dense_dilation), ("--dense-residual-period", self.dense_period))
        if not self.dense_averages:
            for flag, value in chosen:
                if value != 1:
                    raise RealformerConfigError(f"{flag} {value} needs --dense-residual dwa")
            return
        if self.backbone == "resi-dual":
            raise RealformerConfigError(
                "--dense-residual dwa: not with --backbone resi-dual, whose stack carries a second stream "
                "that the averages would leave out"
            )
        if self.hyper_connections:
            raise RealformerConfigError(
                f"--dense-residual dwa: not with --residual-streams {self.residual_streams}: the averages are "
                f"defined on one residual stream"
            )
        for flag in ("--encoder-layers", "--decoder-layers"):
            layers = getattr(args, flag[2:].replace("-", "_"), None)
            if layers is not None and self.dense_period > layers:
                raise RealformerConfigError(
                    f"--dense-residual-period {self.dense_period} is more than {flag} {layers}: that stack would "
                    f"average nowhere"
                )

    @property
    def dense_averages(self) -> bool:
        """The stacks take DenseFormer's depth-weighted averages."""
        return self.dense_residual == "dwa"

    @property
    def hyper_connections(self) -> bool:
        """The stacks carry n > 1 residual streams (Hyper-Connections or mHC)."""
        return self.residual_streams > 1


def _whole_number(value, flag: str) -> int:
    """*flag*'s value as a whole number >= 1 (a string on a command line, a number in a config)."""
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise RealformerConfigError(f"{flag} {value}: give a whole number >= 1")
    return int(text)
