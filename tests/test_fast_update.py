"""The fast update (fairseq_realformer/optim/fast_update.py) is exact: real fairseq-train runs of 31
updates, the plugin's default against ``--fairseq-update`` (fairseq's own per-tensor code), end
with the same parameters and optimizer state bit for bit, in float32 and --bf16, with and without
--clip-norm, with --update-freq 2, with RAdam on two gloo ranks, and across a resume that
switches from one to the other (a study's run in flight resumes with the new default and trains
on unchanged). fairseq's own models keep fairseq's optimizer. Adam's and RAdam's checkpoints pickle
no module of the plugin."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fairseq.optim.adam import Adam
from fairseq.optim.fp16_optimizer import FP16Optimizer
from omegaconf import OmegaConf

from fairseq_realformer.files.checkpoints import allowed_globals
from fairseq_realformer.optim import fast_update

from .cli import OPTIMIZE, TINY, free_port, popen, run
from .helpers import USER_DIR
from .test_compat import FIXTURES

RUN_SECONDS = 150  # on 2 busy cores: 15 tiny fairseq-train processes, two at a time
DATA = FIXTURES / "bin"  # the toy corpus
UPDATES = 31
TRAIN = [
    DATA,
    "--user-dir",
    USER_DIR,
    *"--arch realformer_iwslt_de_en".split(),
    *TINY,
    *OPTIMIZE,
    *"--weight-decay 0.01 --no-epoch-checkpoints --log-format json --log-interval 10".split(),
]
FAST_LINE = "fast update: "
# name: (flags of both runs); each trained twice, fast (the default) and --fairseq-update
SETTINGS = {
    "float32": (),
    "clip-update-freq": ("--clip-norm", "0.1", "--update-freq", "2"),
    "bf16-clip": ("--bf16", "--clip-norm", "0.5"),
}
TWO_RANKS = ("--optimizer", "radam", "--clip-norm", "0.5")  # and the plugin's RAdam, clipped
SWITCH = {"fast": (), "fairseq": ("--fairseq-update",)}


def train(save_dir, *flags, updates=UPDATES):
    log = run("fairseq-train", *TRAIN, "--save-dir", save_dir, "--max-update", str(updates), *flags)
    return log.stdout + log.stderr


def two_ranks(save_dir, *flags):
    port = free_port()
    ddp = [
        *"--ddp-backend legacy_ddp --distributed-backend gloo --distributed-no-spawn".split(),
        *("--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-world-size", "2"),
    ]
    ranks = [
        popen(
            "fairseq-train",
            *TRAIN,
            "--save-dir",
            save_dir,
            "--max-update",
            str(UPDATES),
            *ddp,
            *flags,
            "--distributed-rank",
            str(r),
            "--device-id",
            str(r),
            cwd=save_dir.parent,
        )
        for r in (0, 1)
    ]
    logs = [p.communicate(timeout=600)[0] for p in ranks]
    for p, log in zip(ranks, logs):
        assert p.returncode == 0, log[-3000:]
    return logs[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(setting, switch): (checkpoint folder, log)} for every setting, both switches, two ranks
    and the two resumes across the switch (15 updates one way, then to 31 the other)."""
    work = tmp_path_factory.mktemp("fast_update")
    jobs = {}
    with ThreadPoolExecutor(2) as pool:
        for setting, flags in SETTINGS.items():
            for switch, switch_flags in SWITCH.items():
                folder = work / f"{setting}-{switch}"
                jobs[setting, switch] = (folder, pool.submit(train, folder, *flags, *switch_flags))
        for switch, switch_flags in SWITCH.items():
            folder = work / f"ddp-{switch}"
            folder.mkdir()
            jobs["two-ranks", switch] = (folder, pool.submit(two_ranks, folder, *TWO_RANKS, *switch_flags))

        def resume(first, then, folder):
            log = train(folder, *SWITCH[first], updates=15)
            return log + train(folder, *SWITCH[then])

        for first, then in (("fairseq", "fast"), ("fast", "fairseq")):
            folder = work / f"resumed-{first}-then-{then}"
            jobs["resumed", first] = (folder, pool.submit(resume, first, then, folder))
        return {key: (folder, future.result()) for key, (folder, future) in jobs.items()}


def checkpoint(folder):
    return torch.load(folder / "checkpoint_last.pt", weights_only=False)


def assert_same_training(a, b):
    """Two checkpoints hold the same parameters and optimizer state, bit for bit, at update 31."""
    for ckpt in (a, b):
        assert ckpt["optimizer_history"][-1]["num_updates"] == UPDATES
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    state_a, state_b = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert state_a.keys() == state_b.keys() and len(state_a) > 50
    for index in state_a:
        assert state_a[index].keys() == state_b[index].keys()
        for key, value in state_a[index].items():
            other = state_b[index][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, (index, key)


@pytest.mark.parametrize("setting", [*SETTINGS, "two-ranks"])
def test_fast_update_trains_exactly_as_fairseqs(runs, setting):
    (fast, fast_log), (slow, slow_log) = runs[setting, "fast"], runs[setting, "fairseq"]
    assert FAST_LINE in fast_log and FAST_LINE not in slow_log  # the two paths really differ
    assert_same_training(checkpoint(fast), checkpoint(slow))


@pytest.mark.parametrize("first", ["fairseq", "fast"])
def test_a_run_resumes_across_the_switch_and_trains_on_unchanged(runs, first):
    """A run started one way (a study's run in flight before the fast path existed) resumes the
    other way from its checkpoint and ends as the run that never stopped."""
    folder, log = runs["resumed", first]
    assert "Loaded checkpoint" in log
    uninterrupted, _ = runs["float32", first]
    assert_same_training(checkpoint(folder), checkpoint(uninterrupted))


@pytest.mark.parametrize("setting, optimizer", [("float32", "adam"), ("two-ranks", "radam")])
def test_a_checkpoint_names_no_module_of_the_plugin(runs, setting, optimizer):
    """fairseq-train saves its configuration as plain containers (``Trainer.state_dict``:
    ``OmegaConf.to_container``), so a checkpoint pickles no class of the plugin, not even the
    config dataclass of ``--optimizer radam``: the plugin's modules can move (issue 98) and every
    checkpoint still loads under torch.load(weights_only=True) with fairseq's globals allowed."""
    folder, _ = runs[setting, "fast"]
    assert checkpoint(folder)["cfg"]["optimizer"]["_name"] == optimizer
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(folder / "checkpoint_last.pt"))
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals()}
    assert set(unsafe) <= allowed and not any(g.startswith("fairseq_realformer") for g in unsafe), unsafe


def test_fairseqs_own_transformer_keeps_fairseqs_optimizer(tmp_path):
    log = train(tmp_path, "--arch", "transformer", updates=2)
    assert FAST_LINE not in log


# --- --fp16's copies, in a hand loop: fairseq-train's --fp16 needs a CUDA GPU ------------------------


def fp16_optimizer(monkeypatch, params):
    """fairseq's FP16Optimizer with flat float32 masters over float16 *params* on the CPU (fairseq
    keys the masters by the CUDA device's index; on a CPU a parameter's index is None)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    cfg = OmegaConf.create(
        {
            "optimizer": {"_name": "adam", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8, "weight_decay": 0.01},
            "common": {
                "fp16_scale_window": 128,
                "fp16_init_scale": 1,
                "fp16_scale_tolerance": 0.0,
                "threshold_loss_scale": None,
                "min_loss_scale": 1e-4,
                "fp16_no_flatten_grads": False,
                "bf16": False,
            },
            "optimization": {"update_freq": [1]},
        }
    )
    cfg.optimizer.lr = [1e-2]
    cfg.optimizer.use_old_adam = False
    cfg.optimizer.fp16_adam_stats = False
    cfg.optimizer.tpu = False
    return FP16Optimizer.build_optimizer(cfg, params)


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_fp16_copies_are_fairseqs_bit_for_bit(monkeypatch, clip_norm):
    finals = {}
    for fast in (False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s).half()) for s in ((8, 4), (4,), (3, 5, 2), (6,))]
        initial = [p.detach().clone() for p in params]
        optimizer = fp16_optimizer(monkeypatch, params)
        if fast:
            assert fast_update.install(optimizer)
            assert type(optimizer.fp32_optimizer.optimizer) is fast_update.ForeachAdam
        else:
            assert type(optimizer.fp32_optimizer.optimizer) is Adam
        generator = torch.Generator().manual_seed(1)
        for _ in range(12):
            optimizer.zero_grad()
            for p in params[:-1]:  # the last has no gradient: its master's gradient is zero
                p.grad = torch.randn(p.shape, generator=generator).half()
            optimizer._needs_sync = True
            optimizer.clip_grad_norm(clip_norm)
            optimizer.step()
        assert not any(torch.equal(p, p0) for p, p0 in zip(params[:-1], initial))  # trained at all
        finals[fast] = ([p.detach().clone() for p in params], optimizer.fp32_params[None].detach().clone())
    (slow_params, slow_masters), (fast_params, fast_masters) = finals[False], finals[True]
    assert torch.equal(slow_masters, fast_masters)
    assert all(torch.equal(a, b) for a, b in zip(slow_params, fast_params))
