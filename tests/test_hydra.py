"""fairseq-hydra-train with the Table 7 configs of examples/wmt14/config: every cell composes to
the run examples/wmt14/train.sh makes for it, and a tiny run trains the same model as the
equivalent fairseq-train command line."""

import re
import shlex
import warnings
from pathlib import Path

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.initialize import hydra_init
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_CONFIG_REGISTRY
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from fairseq_realformer.files.checkpoints import read_checkpoint
from fairseq_realformer.options import FLAGS
from fairseq_realformer.variants import VARIANTS

from .cli import TINY, run
from .helpers import REPO, USER_DIR
from .test_compat import FIXTURES

CONFIG = Path(REPO) / "examples" / "wmt14" / "config"
TRAIN_SH = Path(REPO) / "examples" / "wmt14" / "train.sh"
# The cells of the paper's Table 7: (--config-name, depth=) -> train.sh's --lang and --depth
CELLS = {
    ("en_de", "6L-6L"): ("en-de", "6"),
    ("en_de", "12L-12L"): ("en-de", "12"),
    ("en_de", "18L-18L"): ("en-de", "18"),
    ("en_fr", "6L-6L"): ("en-fr", "6"),
    ("en_fr", "60L-12L"): ("en-fr", "60-12"),
}
ROWS = ["post-ln", "pre-ln", "admin", "realformer"]
MODEL_KEYS = [
    "_name",
    "encoder_layers",
    "decoder_layers",
    "encoder_embed_dim",
    "encoder_ffn_embed_dim",
    "encoder_attention_heads",
    "decoder_embed_dim",
    "decoder_ffn_embed_dim",
    "decoder_attention_heads",
    "dropout",
    "share_all_embeddings",
    *(flag.dest for flag in FLAGS),
]
RUN_KEYS = {
    "common": ["fp16", "seed", "log_format", "log_interval"],
    "task": ["data", "source_lang", "target_lang"],
    "criterion": ["_name", "label_smoothing"],
    "optimizer": ["_name", "adam_betas"],
    "optimization": ["lr", "clip_norm", "max_epoch", "update_freq"],
    "lr_scheduler": ["_name", "warmup_updates", "power", "end_learning_rate", "total_num_update"],
    "dataset": ["max_tokens"],
    "checkpoint": ["save_interval", "keep_last_epochs"],
}


def hydra_config(name, *overrides):
    """The configuration fairseq-hydra-train composes from CONFIG, resolved, and hydra's own
    (run folder, whether it changes the working directory)."""
    hydra_init(name)  # what fairseq-hydra-train does first: its schema under the config's name
    with warnings.catch_warnings(), initialize_config_dir(config_dir=str(CONFIG), version_base="1.1"):
        warnings.simplefilter("ignore")  # hydra's deprecation notes about fairseq's schema matching
        cfg = compose(name, overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # ${hydra:runtime.choices...} in save_dir
        run_dir, chdir = cfg.hydra.run.dir, cfg.hydra.job.chdir
        with open_dict(cfg):
            del cfg["hydra"]  # what fairseq receives
        return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), run_dir, chdir


def train_sh_config(lang, depth, row):
    """The configuration of the fairseq-train command `train.sh --dry-run` prints for one cell
    (8 GPUs: the paper's 32k tokens per update with --update-freq 1)."""
    printed = (
        run(
            TRAIN_SH,
            "--dry-run",
            "--gpus",
            "8",
            "--variant",
            row,
            "--depth",
            depth,
            "--lang",
            lang,
            "--total-num-update",
            "300000",
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    words = shlex.split(printed)  # torchrun ... bash -c WRAPPER fairseq-train ARGS...
    argv = words[words.index("fairseq-train") + 1 :]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


def with_arch_defaults(model):
    """A hydra model config with its architecture's defaults, as fairseq's build_model fills them in."""
    if OmegaConf.is_config(model):
        model = OmegaConf.create(OmegaConf.to_container(model))
        with open_dict(model):
            ARCH_CONFIG_REGISTRY[model._name](model)
    return model  # a fairseq-train namespace has them already


def settings(cfg):
    model = with_arch_defaults(cfg.model)
    picked = {f"model.{key}": getattr(model, key, None) for key in MODEL_KEYS if key != "_name"}
    picked["model.arch"] = getattr(model, "_name", None) or model.arch
    for section, keys in RUN_KEYS.items():
        picked.update({f"{section}.{key}": getattr(cfg[section], key) for key in keys})
    return {k: list(v) if OmegaConf.is_list(v) or isinstance(v, (list, tuple)) else v for k, v in picked.items()}


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("cell", CELLS, ids="-".join)
def test_every_table_7_cell_is_the_run_train_sh_makes(cell, row):
    (name, depth), (lang, sh_depth) = cell, CELLS[cell]
    cfg, run_dir, chdir = hydra_config(name, f"model={row}", f"depth={depth}", "lr_scheduler.total_num_update=300000")
    assert settings(cfg) == settings(train_sh_config(lang, sh_depth, row))
    assert cfg.checkpoint.save_dir == f"checkpoints/wmt14_{lang.replace('-', '_')}_{row}_{depth}"
    assert run_dir == cfg.checkpoint.save_dir and chdir is False  # hydra's files go with the checkpoints


def test_model_configs_are_the_variants_of_variants_py():
    for path in sorted((CONFIG / "model").glob("*.yaml")):
        model = OmegaConf.to_container(OmegaConf.load(path))
        flags = VARIANTS[path.stem]
        assert model.pop("_name") == "realformer_wmt_en_de", path
        assert model == {flag[2:].replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}, path
    assert {p.stem for p in (CONFIG / "model").glob("*.yaml")} >= set(ROWS)


def test_hydra_train_builds_the_model_of_the_fairseq_train_command_line(tmp_path):
    """RealFormer (the default row) at a tiny size, 3 updates on the toy corpus, with compiled
    layers (+model.compile_layers=true, as --compile-layers; traced by dynamo alone here)."""
    sizes = TINY[: TINY.index("--share-all-embeddings")]  # --encoder-embed-dim 32 ... (the configs share them too)
    overrides = [f"model.{flag[2:].replace('-', '_')}={value}" for flag, value in zip(sizes[::2], sizes[1::2])]
    result = run(
        "fairseq-hydra-train",
        "--config-dir",
        CONFIG,
        "--config-name",
        "en_de",
        f"common.user_dir={USER_DIR}",
        "common.fp16=false",
        f"task.data={FIXTURES / 'bin'}",
        "task.source_lang=src",
        "task.target_lang=tgt",
        *overrides,
        "optimization.max_update=3",
        "lr_scheduler.total_num_update=3",
        "lr_scheduler.warmup_updates=1",
        "dataset.max_tokens=1000",
        "dataset.num_workers=0",
        "+model.compile_layers=true",
        f"checkpoint.save_dir={tmp_path / 'ckpt'}",
        cwd=tmp_path,
        env={"REALFORMER_COMPILE_BACKEND": "eager"},
    )
    log = result.stdout + result.stderr
    assert "ADMIN omega initialised by profiling" in log  # the row's --admin-init profile
    assert re.search(r"--compile-layers: \d+ graphs compiled in", log), log[-3000:]
    checkpoint = read_checkpoint(tmp_path / "ckpt" / "checkpoint_last.pt")
    assert checkpoint["optimizer_history"][-1]["num_updates"] == 3
    assert (tmp_path / "ckpt" / ".hydra" / "config.yaml").exists()  # the composed config, with the checkpoints

    argv = [
        str(FIXTURES / "bin"),
        "--user-dir",
        USER_DIR,
        "--arch",
        "realformer_wmt_en_de",
        *VARIANTS["realformer"],
        *TINY,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
    ]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    model = tasks.setup_task(cfg.task).build_model(cfg.model)  # as fairseq_cli.train.main builds it
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    trained = {name: tuple(p.shape) for name, p in checkpoint["model"].items()}
    assert trained == expected
    assert sum(p.numel() for p in checkpoint["model"].values()) == sum(p.numel() for p in model.state_dict().values())
    assert f"num. shared model params: {sum(p.numel() for p in model.parameters()):,}" in log


@pytest.mark.skipif(torch.cuda.is_available(), reason="the configs' fp16 is refused only without a GPU")
def test_a_plugin_error_under_hydra_is_its_message_alone_between_hydras_lines(tmp_path):
    """The configs train in fp16; without a GPU the plugin refuses it. hydra shows our error as its
    message alone, no traceback: its overrides line before, its hint after (docs/recipes.md)."""
    result = run(
        "fairseq-hydra-train",
        "--config-dir",
        CONFIG,
        "--config-name",
        "en_de",
        f"common.user_dir={USER_DIR}",
        f"task.data={FIXTURES / 'bin'}",
        "task.source_lang=src",
        "task.target_lang=tgt",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "lr_scheduler.total_num_update=3",
        "dataset.num_workers=0",
        f"checkpoint.save_dir={tmp_path / 'ckpt'}",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    message = "--fp16 needs a CUDA GPU, and torch sees none on this machine: leave out --fp16 to train in float32"
    lines = result.stderr.strip().splitlines()
    assert lines[-4].startswith("Error executing job with overrides: ['common.user_dir=")
    assert lines[-3:] == [message, "", "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."]
    assert message in (Path(REPO) / "docs" / "recipes.md").read_text()  # shown there as printed
