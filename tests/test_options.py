"""The plugin's options: one table makes the flags, the architectures' defaults and the checks;
they are parsed once per model into one frozen object that every layer reads."""

import argparse
import dataclasses
import subprocess
import sys

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_realformer import options
from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.variants import VARIANTS

from .helpers import USER_DIR, FakeTask, make_dictionary, parse_args, realformer, write_clinic_profile

DICT = make_dictionary()


def test_every_flag_is_on_the_command_line_and_the_architecture_sets_the_papers_defaults():
    args = parse_args("realformer_iwslt_de_en")
    for flag in options.FLAGS:
        assert getattr(args, flag.dest) == flag.default, flag.name
    assert (args.residual_attention_paths, args.residual_attention_mode, args.backbone) == ("all", "mean", "admin")
    assert parse_args("admin_iwslt_de_en").residual_attention_paths == "none"  # the ADMIN baseline
    given = parse_args("admin_iwslt_de_en", "--residual-attention-paths", "cross", "--backbone", "pre-ln")
    assert (given.residual_attention_paths, given.backbone) == ("cross", "pre-ln")  # flags win


@pytest.mark.parametrize("arch", ["realformer", "realformer_wmt_en_de", "admin_iwslt_de_en"])
@pytest.mark.parametrize(
    "flags, error",
    [
        (
            ["--residual-attention-paths", "encoder,foo"],
            "--residual-attention-paths: unknown path 'foo'; give a comma "
            "list of encoder, decoder, cross, or all, or none",
        ),
        (["--residual-attention-mode", "avg"], "--residual-attention-mode avg: choose from sum, mean"),
        (
            ["--backbone", "postln"],
            "--backbone postln: choose from post-ln, pre-ln, admin, deepnorm, rezero, t-fixup, resi-dual",
        ),
        (["--admin-init", "clinic"], "--admin-init clinic: choose from closed-form, profile"),
        (
            ["--backbone", "rezero", "--layernorm-embedding"],
            "--layernorm-embedding adds a LayerNorm, but --backbone rezero has none",
        ),
        (
            ["--admin-init-path", "/no/such/profile.ratio.init"],
            "--admin-init-path /no/such/profile.ratio.init: No such file or directory",
        ),
    ],
)
def test_every_plugin_flag_is_checked_while_fairseq_parses_the_command_line(arch, flags, error):
    """fairseq runs the architecture inside parse_args_and_arch: the parser itself refuses,
    before fairseq-train logs its config, builds anything or makes its save dir."""
    with pytest.raises(RealformerConfigError) as refused:
        parse_args(arch, *flags)
    assert str(refused.value) == error


def test_the_clinic_file_is_read_while_parsing_unless_training_resumes(tmp_path):
    clinic = tmp_path / "profile.ratio.init"
    write_clinic_profile(clinic, [1.0] * 12, [1.0] * 18)  # a 6L-6L profile, the models here are 3L-3L
    with pytest.raises(RealformerConfigError, match=r"holds 12 \+ 18 sublayer ratios, but this 3L-3L model needs 6"):
        parse_args("realformer", "--admin-init-path", str(clinic))
    # a resumed run takes ω from its checkpoint: the file is not read, and may even be gone
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint_last.pt").write_bytes(b"")
    for path in (clinic, tmp_path / "gone.init"):
        args = parse_args("realformer", "--admin-init-path", str(path), "--save-dir", str(tmp_path / "ckpt"))
        assert args.admin_init_path == str(path)
        assert not hasattr(args, "_realformer_on_command_line")  # parsing marks, checks and unmarks
    args = parse_args("realformer", "--admin-init-path", str(tmp_path / "gone.init"), "--finetune-from-model", "x.pt")
    assert args.admin_init_path == str(tmp_path / "gone.init")


def test_set_defaults_refuses_what_is_not_an_option():
    with pytest.raises(TypeError, match="not plugin options: residual_paths"):
        options.set_defaults(argparse.Namespace(), residual_paths="none")


def test_one_frozen_options_object_per_model_read_by_every_layer():
    model = realformer("encoder,cross", "sum", "pre-ln", dictionary=DICT)
    opts = model.options
    assert opts == options.RealformerOptions(frozenset({"encoder", "cross"}), False, "pre-ln", "closed-form", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.backbone = "admin"
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert all(layer.options is opts for layer in layers) and model.encoder.options is model.decoder.options is opts
    assert all(layer.normalize_before for layer in layers)  # derived from --backbone pre-ln
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None
    # the backbone is stored once: fairseq's own Pre-LN flags stay as the user gave them
    args = parse_args("realformer", "--backbone", "pre-ln")
    ARCH_MODEL_REGISTRY["realformer"].build_model(args, FakeTask(DICT))
    assert args.encoder_normalize_before is False and args.decoder_normalize_before is False


def test_a_model_lacking_options_gets_todays_defaults():
    """An older checkpoint's args without the plugin's options build the paper's model."""
    args = parse_args("realformer")
    for flag in options.FLAGS:
        delattr(args, flag.dest)
    model = ARCH_MODEL_REGISTRY["realformer"].build_model(args, FakeTask(DICT))
    assert model.options.paths == frozenset(options.PATHS) and model.options.running_mean
    assert isinstance(model.decoder.layers[0].encoder_attn, ResidualMultiheadAttention)


ALL, NONE = frozenset(options.PATHS), frozenset()
# each variant's options as its name promises: (score paths, running mean, backbone, --admin-init,
# value-residual paths)
VARIANT_OPTIONS = {
    "post-ln": (NONE, True, "post-ln", "closed-form"),
    "pre-ln": (NONE, True, "pre-ln", "closed-form"),
    "admin": (NONE, True, "admin", "profile"),
    "deepnorm": (NONE, True, "deepnorm", "closed-form"),
    "realformer": (ALL, True, "admin", "profile"),
    "realformer-sum": (ALL, False, "admin", "profile"),
    "post-ln-realformer": (ALL, True, "post-ln", "closed-form"),
    "pre-ln-realformer": (ALL, True, "pre-ln", "closed-form"),
    "rezero": (NONE, True, "rezero", "closed-form"),
    "rezero-realformer": (ALL, True, "rezero", "closed-form"),
    "t-fixup": (NONE, True, "t-fixup", "closed-form"),
    "t-fixup-realformer": (ALL, True, "t-fixup", "closed-form"),
    "admin-radam": (NONE, True, "admin", "profile"),
    "realformer-value-residual": (ALL, True, "admin", "profile", ALL),
    "resi-dual": (NONE, True, "resi-dual", "closed-form"),
    "resi-dual-realformer": (ALL, True, "resi-dual", "closed-form"),
    "pre-ln-hyper-connections": (NONE, True, "pre-ln", "closed-form", NONE, {"residual_streams": 4}),
    "pre-ln-mhc": (NONE, True, "pre-ln", "closed-form", NONE, {"residual_streams": 4, "residual_streams_mix": "mhc"}),
    "pre-ln-denseformer": (NONE, True, "pre-ln", "closed-form", NONE, {"dense_residual": "dwa"}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_named_variant_builds_with_the_options_its_name_promises(name):
    args = parse_args("realformer_iwslt_de_en", *VARIANTS[name])
    model = ARCH_MODEL_REGISTRY["realformer"].build_model(args, FakeTask(DICT))
    paths, running_mean, backbone, admin_init, *rest = VARIANT_OPTIONS[name]
    value_paths = rest[0] if rest else NONE
    residual = rest[1] if len(rest) > 1 else {}  # the residual-stream options
    assert model.options == options.RealformerOptions(
        paths, running_mean, backbone, admin_init, None, value_paths, "half", **residual
    )
    # only admin-radam changes the training recipe: RAdam without warm-up
    radam = (args.optimizer, args.warmup_updates) == ("radam", 0)
    assert radam == (name == "admin-radam")


def test_every_named_variant_is_in_the_table_above():
    assert set(VARIANT_OPTIONS) == set(VARIANTS)


def test_variants_print_their_flags_for_shell_scripts():
    script = f"{USER_DIR}/variants.py"
    result = subprocess.run([sys.executable, script, "realformer"], capture_output=True, text=True)
    assert result.stdout.splitlines() == list(VARIANTS["realformer"])
    result = subprocess.run([sys.executable, script, "realformer-man"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"variants.py: error: --variant: unknown realformer-man; choose from {', '.join(VARIANTS)}"
    )
