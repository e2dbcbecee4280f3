"""ADMIN's profiled initialisation (in the model, in the checkpoint, identical across ranks),
Transformer-Clinic profile files, and DeepNorm's α and β."""

import math
import re

import pytest
import torch
import torch.multiprocessing as mp

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules.admin import pending, read_clinic_profile
from fairseq_realformer.modules.backbones import deepnorm_alpha_beta as alpha_beta

from .cli import TRAIN, free_port, popen, preprocess, run
from .helpers import (
    EMBED,
    HEADS,
    USER_DIR,
    make_dictionary,
    model_sums,
    random_batch,
    realformer,
    rounding,
    write_clinic_profile,
)
from .reference import reference_forward

DICT = make_dictionary()
SRC_LENS, TGT_LENS = [6, 9, 4, 7], [5, 7, 3, 6]
# ω, relative: through the model, then variances over the batch's tokens (at most 4 x 9 of EMBED values)
OMEGA_ROUNDING = rounding(*model_sums(), len(SRC_LENS) * max(SRC_LENS) * EMBED)


def profiled_model(*flags, layers=3, seed=0):
    depth = ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    return realformer("all", "mean", "admin", "--admin-init", "profile", *depth, *flags, dictionary=DICT, seed=seed)


def net_input(src, src_len, prev):
    return {"src_tokens": src, "src_lengths": src_len, "prev_output_tokens": prev}


def omegas(model):
    """Every sublayer's ω (a vector per sublayer), encoder then decoder, in running order."""
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    return [w.detach().clone() for layer in layers for w in layer.sublayer_omegas()]


def scalar_omegas(model):
    values = omegas(model)
    for w in values:  # profiling sets one value per sublayer
        assert torch.all(w == w[0])
    return [float(w[0]) for w in values]


# --- profiling computes the paper's formula ---------------------------------------------------------


def test_profiling_sets_omega_by_the_formula():
    """Dropout is 0 in the tiny models, which makes the pass deterministic."""
    model = profiled_model()
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS, seed=4)
    assert pending(model) and scalar_omegas(model) == [1.0] * 15
    model.initialize_admin(net_input(src, src_len, prev))
    assert not pending(model) and float(model.admin_initialized) == 1.0

    ref = reference_forward(
        model,
        src,
        prev,
        paths={"encoder", "decoder", "cross"},
        mode="mean",
        backbone="admin",
        heads=HEADS,
        profile=True,
    )
    want = ref["encoder_omegas"] + ref["decoder_omegas"]
    assert scalar_omegas(model) == pytest.approx(want, rel=OMEGA_ROUNDING)


def test_profiled_omega_grows_with_depth():
    model = profiled_model("--encoder-embed-dim", "32", "--decoder-embed-dim", "32", layers=6)
    model.initialize_admin(net_input(*random_batch(DICT, SRC_LENS, TGT_LENS)))
    values = scalar_omegas(model)
    encoder, decoder = values[:12], values[12:]
    for stack in (encoder, decoder):
        assert stack[0] == 1.0
        assert all(b > a for a, b in zip(stack, stack[1:])), stack
    assert encoder[-1] > 1.5 and decoder[-1] > 1.5  # the closed form for 12 sublayers: 2.017


def test_padding_does_not_change_the_statistics():
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS, seed=4)
    pad = DICT.pad()
    wider_src = torch.cat([torch.full((len(src), 5), pad), src], dim=1)  # more left padding
    wider_prev = torch.cat([prev, torch.full((len(prev), 4), pad)], dim=1)  # more right padding
    results = []
    for batch in ((src, src_len, prev), (wider_src, src_len, wider_prev)):
        model = profiled_model()
        model.initialize_admin(net_input(*batch))
        results.append(scalar_omegas(model))
    assert results[1] == pytest.approx(results[0], rel=OMEGA_ROUNDING)


def test_training_before_initialisation_is_refused():
    model = profiled_model().train()
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    with pytest.raises(RealformerConfigError, match="initialize_admin"):
        model(src, src_len, prev)


def test_checkpoint_carries_omega_and_loading_never_profiles_again():
    first = profiled_model()
    first.initialize_admin(net_input(*random_batch(DICT, SRC_LENS, TGT_LENS, seed=1)))
    resumed = profiled_model(seed=5)
    resumed.load_state_dict(first.state_dict())
    assert not pending(resumed)
    resumed.initialize_admin(net_input(*random_batch(DICT, [9, 9], [9, 9], seed=2)))  # a no-op now
    for got, want in zip(omegas(resumed), omegas(first)):
        assert torch.equal(got, want)
    resumed.train()(*random_batch(DICT, SRC_LENS, TGT_LENS))  # and training may start


# --- two processes agree --------------------------------------------------------------------------


def _profile_on_rank(rank, world, port, batch, out):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = profiled_model()
        rows = slice(rank * len(batch[0]) // world, (rank + 1) * len(batch[0]) // world)
        model.initialize_admin(net_input(*(t[rows] for t in batch)))
        torch.save(omegas(model), f"{out}/omegas{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_end_with_the_omega_of_one_pass_over_both_batches(tmp_path):
    """Statistics are summed over processes: each rank profiles its own half of the batch and
    both end with exactly what one process gets from the whole batch."""
    batch = random_batch(DICT, SRC_LENS, TGT_LENS, seed=4)
    mp.spawn(_profile_on_rank, args=(2, free_port(), batch, str(tmp_path)), nprocs=2)
    rank0, rank1 = (torch.load(tmp_path / f"omegas{r}.pt") for r in (0, 1))
    single = profiled_model()
    single.initialize_admin(net_input(*batch))
    for w0, w1, want in zip(rank0, rank1, omegas(single)):
        assert torch.equal(w0, w1)
        torch.testing.assert_close(w0, want, rtol=OMEGA_ROUNDING, atol=0)  # two halves summed, then added


# --- Transformer-Clinic's profile.ratio.init ------------------------------------------------------------


def test_clinic_profile_round_trips(tmp_path):
    """A Clinic file sets the model's ω, and the model's ω write back to the same file."""
    encoder = [1.0 + 0.25 * i for i in range(6)]
    decoder = [1.0 + 0.125 * i for i in range(9)]
    path = tmp_path / "profile.ratio.init"
    write_clinic_profile(path, encoder, decoder)
    assert path.read_text().splitlines()[:3] == ["1 1.0", "2 1.25", "3 1.5"]
    assert read_clinic_profile(path, 3, 3) == (encoder, decoder)

    model = realformer("all", "mean", "admin", "--admin-init-path", str(path), dictionary=DICT)
    assert pending(model)
    model.initialize_admin()
    assert scalar_omegas(model) == encoder + decoder
    again = tmp_path / "again.init"
    values = scalar_omegas(model)
    write_clinic_profile(again, values[:6], values[6:])
    assert again.read_text() == path.read_text()


def test_clinic_profile_of_another_depth_is_a_clear_error(tmp_path):
    path = tmp_path / "profile.ratio.init"
    write_clinic_profile(path, [1.0] * 12, [1.0] * 18)  # a 6L-6L profile
    with pytest.raises(
        RealformerConfigError, match=r"--admin-init-path .* 12 \+ 18 .* 3L-3L model needs 6 encoder \+ 9"
    ):
        realformer("all", "mean", "admin", "--admin-init-path", str(path), dictionary=DICT)
    path.write_text("1 1.0\n3 1.5\n")
    with pytest.raises(RealformerConfigError, match="line 2 has sublayer index 3, expected 2"):
        read_clinic_profile(path, 1, 1)


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--admin-init", "profile", "--admin-init-path", "x"], "--admin-init profile and --admin-init-path"),
        (["--backbone", "post-ln", "--admin-init", "profile"], "--backbone is post-ln"),
        (["--backbone", "deepnorm", "--admin-init-path", "x"], "--backbone is deepnorm"),
        (["--backbone", "deepnorm", "--encoder-normalize-before"], "--backbone deepnorm"),
    ],
)
def test_contradicting_flags_name_the_flags(flags, names):
    with pytest.raises(RealformerConfigError, match=names):
        realformer("all", "mean", "admin", *flags, dictionary=DICT)


# --- DeepNorm ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, encoder, decoder",
    [
        # α = 0.81 (N⁴M)^(1/16), β = 0.87 (N⁴M)^(-1/16);  α = (3M)^(1/4), β = (12M)^(-1/4)
        ((6, 6), (0.81 * 6 ** (5 / 16), 0.87 * 6 ** (-5 / 16)), (18**0.25, 72**-0.25)),
        ((18, 18), (0.81 * 18 ** (5 / 16), 0.87 * 18 ** (-5 / 16)), (54**0.25, 216**-0.25)),
    ],
)
def test_deepnorm_alpha_and_beta(layers, encoder, decoder):
    n, m = layers
    assert alpha_beta(n, m, "encoder") == pytest.approx(encoder)
    assert alpha_beta(n, m, "decoder") == pytest.approx(decoder)
    if layers == (6, 6):  # the numbers, spelled out
        assert encoder == pytest.approx((1.418, 0.497), abs=1e-3)
        assert decoder == pytest.approx((2.060, 0.343), abs=1e-3)


def test_deepnorm_scales_value_output_and_ffn_weights_by_beta():
    depth = ["--encoder-layers", "6", "--decoder-layers", "6"]
    deep = realformer("all", "mean", "deepnorm", *depth, dictionary=DICT, seed=3)
    plain = realformer("all", "mean", "post-ln", *depth, dictionary=DICT, seed=3)  # same draws
    (alpha_e, beta_e), (alpha_d, beta_d) = alpha_beta(6, 6, "encoder"), alpha_beta(6, 6, "decoder")
    assert all(layer.residual_alpha == alpha_e for layer in deep.encoder.layers)
    assert all(layer.residual_alpha == alpha_d for layer in deep.decoder.layers)
    plain_params = dict(plain.named_parameters())
    scaled = 0
    for name, p in deep.named_parameters():
        beta = beta_e if name.startswith("encoder.layers") else beta_d
        if re.search(
            r"layers\.\d+\.(fc1|fc2|self_attn\.v_proj|self_attn\.out_proj|encoder_attn\.v_proj|encoder_attn\.out_proj)\.",
            name,
        ):
            torch.testing.assert_close(p, plain_params[name] * beta)
            scaled += 1
        else:  # queries, keys, layer norms, embeddings keep their initialisation
            assert torch.equal(p, plain_params[name]), name
    assert scaled == 6 * (4 + 6) * 2  # weight and bias of 4 encoder / 6 decoder projections


# --- end to end: two CPU ranks, resume, generation elsewhere ---------------------------------------------


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("admin_cli")
    preprocess(work)
    port = free_port()
    flags = [
        "bin",
        *TRAIN,
        "--admin-init",
        "profile",
        "--max-update",
        "6",
        "--save-dir",
        "ckpt",
        "--ddp-backend",
        "legacy_ddp",
        "--distributed-backend",
        "gloo",
        "--distributed-no-spawn",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-world-size",
        "2",
        # and compiled layers under DDP: the profiling pass runs eager, training compiled (traced by
        # dynamo alone: seconds; tests/test_compiled_layers.py runs inductor's code)
        "--compile-layers",
    ]
    env = {"REALFORMER_COMPILE_BACKEND": "eager"}
    ranks = [
        popen("fairseq-train", *flags, "--distributed-rank", str(r), "--device-id", str(r), cwd=work, env=env)
        for r in (0, 1)
    ]
    logs = [p.communicate(timeout=600)[0] for p in ranks]
    for p, log in zip(ranks, logs):
        assert p.returncode == 0, log[-3000:]
    return work, logs[0]


def test_two_rank_training_profiles_once_into_the_checkpoint(two_rank_run):
    work, log = two_rank_run
    assert log.count("ADMIN omega initialised by profiling") == 1
    assert "training on 2 devices" in log
    assert re.search(r"--compile-layers: \d+ graphs compiled in", log)
    state = torch.load(work / "ckpt" / "checkpoint_last.pt", weights_only=False)["model"]
    assert float(state["admin_initialized"]) == 1.0
    ffn = state["encoder.layers.1.ffn_omega"]
    assert ffn.min() > 1.5, "the last encoder sublayer's ω should have grown well above 1"


def test_resumed_run_keeps_omega_and_never_profiles(two_rank_run):
    work, _ = two_rank_run
    before = torch.load(work / "ckpt" / "checkpoint_last.pt", weights_only=False)["model"]
    result = run(
        "fairseq-train", "bin", *TRAIN, "--admin-init", "profile", "--max-update", "7", "--save-dir", "ckpt", cwd=work
    )
    log = result.stdout + result.stderr
    assert "Loaded checkpoint ckpt/checkpoint_last.pt" in log and "ADMIN omega initialised" not in log
    after = torch.load(work / "ckpt" / "checkpoint_last.pt", weights_only=False)["model"]
    for name in before:
        if name.endswith("_omega"):  # one more Adam step moves ω by ~lr, re-profiling would reset it
            assert (after[name] - before[name]).abs().max() < 0.01, name


def test_generation_elsewhere_needs_no_profile_file(two_rank_run, tmp_path):
    work, _ = two_rank_run
    clinic = work / "profile.ratio.init"
    write_clinic_profile(clinic, [1.0 + 0.5 * i for i in range(4)], [1.0 + 0.25 * i for i in range(6)])
    run(
        "fairseq-train",
        "bin",
        *TRAIN,
        "--admin-init-path",
        "profile.ratio.init",
        "--max-update",
        "2",
        "--save-dir",
        "ckpt_clinic",
        cwd=work,
    )
    for checkpoint in ("ckpt/checkpoint_last.pt", "ckpt_clinic/checkpoint_last.pt"):
        result = run(
            "fairseq-generate",
            str(work / "bin"),
            "--user-dir",
            USER_DIR,
            "--path",
            str(work / checkpoint),
            "--beam",
            "4",
            "--batch-size",
            "8",
            cwd=tmp_path,
        )
        assert len(re.findall(r"^H-\d+\t", result.stdout, re.M)) > 0
    assert not (tmp_path / "profile.ratio.init").exists()
    state = torch.load(work / "ckpt_clinic" / "checkpoint_last.pt", weights_only=False)["model"]
    assert math.isclose(float(state["decoder.layers.1.ffn_omega"].mean()), 2.25, rel_tol=0.01)
