"""Is DeepNorm's collapse the plugin's or the method's? The plugin's ``--backbone deepnorm`` model
and torchscale's (the DeepNet authors' library) ``EncoderDecoder(deepnorm=True)``, from the same
initial weights and checked to compute the same forward pass, trained side by side on the same
batches with the same optimizer, schedule, loss and dropout masks, measured every few updates.

    pip install --no-deps torchscale fairscale==0.4.0   # a study tool, not a requirement (see below)
    python studies/deepnorm_vs_torchscale.py --check-only                 # the forward passes only
    python studies/deepnorm_vs_torchscale.py                              # 4+4, lr 2e-3, seed 1, 660 updates
    python studies/deepnorm_vs_torchscale.py --layers 18 --lr 1e-3 --updates 200
    python studies/deepnorm_vs_torchscale.py --arms plugin,torchscale,torchscale-own-init
    pip uninstall -y torchscale fairscale               # after: see below

The plugin's model is the study's (run.sh's flags, the "cpu" preset, ``--backbone deepnorm``).
torchscale's takes fairseq's shared token embedding and sinusoidal positions, set as torchscale's
fairseq example sets it (examples/fairseq/models/machine_translation.py): embeddings scaled by √d
(its config's default is not to), ReLU, padding masks handed to encoder and decoder
(``EncoderDecoder.forward`` hands none). The plugin's initial weights are copied into it (``fc1`` is
``ffn.fc1`` there): a difference in training is one of structure, not of the draw.
``torchscale-own-init`` is torchscale's model initialised its own way from --seed (PyTorch's Linear
default, then its DeepNorm scaling, whose encoder β is 1.15·(N⁴M)^(−1/16) where the paper has 0.87).

Each model steps as fairseq's Trainer steps it: fairseq's batches in their order, dropout seed
--seed + updates, fairseq's Adam and polynomial_decay (the "cpu" preset's), no clipping; torchscale's
dropout masks are drawn on fairseq's time-major layout, so one seed drops the same units in both.
Every --every updates and at each epoch's end (where fairseq-train validates), each model is measured
on --subset as source_use.py measures a checkpoint, with the label-smoothed loss beside it.

torchscale 0.3.0 imports fairscale and timm (for drop-path, off here; timm needs a torchvision built
for one torch): without timm, a stand-in that refuses to run is registered. Uninstall both when
done: with fairscale installed, fairseq imports it and the suite's fairseq-train processes
(tests/test_fast_update.py) aborted at exit ("terminate called without an active exception").
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from common.commands import InputError, exit_on_failure
from common.presets import PRESETS, TRAINING
from common.repo import REPO, RUNS, USER_DIR, VARIANTS, repo_relative
from common.results import write_result
from studies.checkpoints import batches, import_plugin, training_task
from studies.source_use import fresh_model, measure, rounded

PROG = "deepnorm_vs_torchscale.py"
INSTALL = "pip install --no-deps torchscale fairscale==0.4.0"
ARMS = ("plugin", "torchscale", "torchscale-own-init")
# flag, default (its type is the flag's), help
OPTIONS = (
    ("--data", str(RUNS / "depth-18" / "data" / "bin"), "binarised en-de data"),
    ("--layers", 4, "encoder and decoder layers"),
    ("--lr", 2e-3, "peak learning rate"),
    ("--seed", 1, "initialisation and dropout seed"),
    ("--updates", 660, "updates to train (660: 5 epochs)"),
    ("--every", 25, "measure every N updates"),
    ("--warmup", PRESETS["cpu"].warmup, "warm-up updates"),
    ("--epochs", PRESETS["cpu"].epochs, "the schedule's length in epochs: the rate reaches 0 after this many"),
    ("--subset", "valid", "the split measured"),
    ("--max-tokens", 4096, "tokens per batch"),
    ("--threads", 2, "torch threads"),
    ("--arms", "plugin,torchscale", f"models to train, of {', '.join(ARMS)}"),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, what in OPTIONS:
        p.add_argument(flag, type=type(default), default=default, help=f"{what} (default: %(default)s)")
    p.add_argument("--check-only", action="store_true", help="only build the models and compare their passes")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the result here (default: studies/results/cpu-deepnorm-vs-torchscale-LAYERS-multi30k-en-de.json; "
        "with --check-only, none)",
    )
    args = p.parse_args(argv)
    args.data, args.arms = Path(args.data), [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.arms:
        p.error(f"--arms: unknown {', '.join(unknown) or 'nothing given'}; choose from {', '.join(ARMS)}")
    for flag in ("layers", "updates", "every", "threads", "epochs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} {getattr(args, flag)}: must be at least 1")
    return args


# --- torchscale -------------------------------------------------------------------------------------


def import_torchscale():
    """torchscale's EncoderDecoder, its config and its version; InputError saying how to install it.
    timm (for drop-path only) gets a stand-in when it cannot be imported (see the docstring)."""
    import importlib.metadata
    import types

    try:
        import timm.models.layers
    except Exception:  # absent, or present without torchvision
        for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
            del sys.modules[name]

        def drop_path(*_, **__):
            raise NotImplementedError("timm stand-in (deepnorm_vs_torchscale.py): drop-path is off here")

        timm, models, layers = map(types.ModuleType, ("timm", "timm.models", "timm.models.layers"))
        timm.models, models.layers, layers.drop_path = models, layers, drop_path
        sys.modules.update({m.__name__: m for m in (timm, models, layers)})
    try:
        from torchscale.architecture.config import EncoderDecoderConfig
        from torchscale.architecture.encoder_decoder import EncoderDecoder
    except ModuleNotFoundError as e:
        raise InputError(f"torchscale cannot be imported ({e}): {INSTALL}") from None
    return EncoderDecoder, EncoderDecoderConfig, importlib.metadata.version("torchscale")


def torchscale_config(args, vocab_size: int):
    """torchscale's config for the fairseq model of *args* (a fairseq Namespace), with torchscale's
    fairseq example's settings; ValueError where the fairseq model has a part this mapping lacks."""
    _, EncoderDecoderConfig, _ = import_torchscale()
    refused = {
        "--share-all-embeddings": not args.share_all_embeddings,
        "learned positions": args.encoder_learned_pos or args.decoder_learned_pos,
        "--layernorm-embedding": getattr(args, "layernorm_embedding", False),
        "--no-scale-embedding": getattr(args, "no_scale_embedding", False),
        "--no-token-positional-embeddings": getattr(args, "no_token_positional_embeddings", False),
        "Pre-LN": args.encoder_normalize_before or args.decoder_normalize_before,
    }
    if any(refused.values()):
        raise ValueError(f"not mapped to torchscale: {', '.join(k for k, v in refused.items() if v)}")
    sizes = ("embed_dim", "ffn_embed_dim", "attention_heads", "layers")
    same = [f"{side}_{size}" for side in ("encoder", "decoder") for size in sizes]
    same += ["activation_fn", "dropout", "attention_dropout", "activation_dropout"]
    same += ["max_source_positions", "max_target_positions"]
    return EncoderDecoderConfig(
        deepnorm=True,  # sets Post-LN and no sub-LayerNorm
        no_scale_embedding=False,  # fairseq scales by √d; torchscale's config does not by default
        layernorm_embedding=False,
        share_all_embeddings=True,
        vocab_size=vocab_size,
        layernorm_eps=1e-5,  # fairseq's LayerNorm
        **{name: getattr(args, name) for name in same},
    )


class TimeMajorDropout(nn.Dropout):  # the mask drawn as fairseq's layers draw it (T x B x C)
    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        return F.dropout(x.transpose(0, 1).contiguous(), self.p, True).transpose(0, 1)


def build_torchscale(args, dictionary, align_dropout: bool = True):
    """torchscale's DeepNorm EncoderDecoder for the fairseq model of *args*, in a wrapper that
    fairseq's criterion, batches and source_use.measure take as a fairseq model; *align_dropout*: its
    layers' dropout draws on the time-major layout."""
    from fairseq import utils
    from fairseq.models.transformer import Embedding
    from fairseq.modules import PositionalEmbedding

    EncoderDecoder, _, _ = import_torchscale()
    config = torchscale_config(args, len(dictionary))
    pad = dictionary.pad()

    class TorchscaleTranslation(nn.Module):
        """As torchscale's fairseq example calls it (padding masks given), answering as a fairseq
        encoder-decoder: logits B x T x V, and ``encoder()``'s states T x B x C."""

        def __init__(self):
            super().__init__()
            embed = Embedding(len(dictionary), config.encoder_embed_dim, pad)  # fairseq's N(0, d^-1/2)
            source, target = (
                PositionalEmbedding(n, config.encoder_embed_dim, pad, learned=False) for n in self.max_positions()
            )
            self.ts = EncoderDecoder(
                config, encoder_embed_tokens=embed, encoder_embed_positions=source, decoder_embed_positions=target
            )

        def forward(self, src_tokens, src_lengths=None, prev_output_tokens=None, **_):
            encoder_out = self.ts.encoder(src_tokens, encoder_padding_mask=src_tokens.eq(pad))
            return self.ts.decoder(
                prev_output_tokens, self_attn_padding_mask=prev_output_tokens.eq(pad), encoder_out=encoder_out
            )

        def encoder(self, src_tokens, src_lengths=None, return_all_hiddens=False):
            out = self.ts.encoder(src_tokens, encoder_padding_mask=src_tokens.eq(pad), return_all_hiddens=True)
            return {
                "encoder_out": [out["encoder_out"].transpose(0, 1)],
                "encoder_states": [x.transpose(0, 1) for x in out["encoder_states"]] if return_all_hiddens else [],
                "encoder_padding_mask": [out["encoder_padding_mask"]],
            }

        def get_normalized_probs(self, net_output, log_probs, sample=None):
            return (utils.log_softmax if log_probs else utils.softmax)(net_output[0], dim=-1)

        def get_targets(self, sample, net_output):
            return sample["target"]

        def max_positions(self):
            return (config.max_source_positions, config.max_target_positions)

    model = TorchscaleTranslation()
    if align_dropout:
        for layer in [*model.ts.encoder.layers, *model.ts.decoder.layers]:
            layer.dropout_module = TimeMajorDropout(layer.dropout_module.p)
            layer.ffn.dropout_module = TimeMajorDropout(layer.ffn.dropout_module.p)
    return model


def parameter_pairs(plugin, torchscale):
    """[(plugin name, plugin parameter, torchscale name, torchscale parameter)], one-to-one over every
    parameter of both (tied ones once); ValueError naming any parameter left unpaired or misshapen."""
    theirs = dict(torchscale.named_parameters())
    pairs, missing = [], []
    for name, p in plugin.named_parameters():
        their_name = "ts." + name.replace(".fc1.", ".ffn.fc1.").replace(".fc2.", ".ffn.fc2.")
        other = theirs.pop(their_name, None)
        if other is None or other.shape != p.shape:
            missing.append(name)
        else:
            pairs.append((name, p, their_name, other))
    if missing or theirs:
        raise ValueError(f"unpaired: plugin {missing}, torchscale {sorted(theirs)}")
    return pairs


def copy_weights(plugin, torchscale, pairs=None) -> None:
    """Copy every parameter of the plugin's model into torchscale's (*pairs*: parameter_pairs's)."""
    with torch.no_grad():
        for _, mine, _, theirs in pairs or parameter_pairs(plugin, torchscale):
            theirs.copy_(mine)


# --- the plugin's model, the study's way ------------------------------------------------------------


def study_flags(args, total: int):
    """fairseq-train's arguments as the study gives them (run.sh's, the "cpu" preset's, the variant's),
    with the learning rate reaching 0 after *total* updates."""
    return [
        str(args.data), "--user-dir", str(USER_DIR), "--arch", "realformer_iwslt_de_en", *TRAINING,
        "--source-lang", "en", "--target-lang", "de", "--dropout", "0.3", "--max-tokens", str(args.max_tokens),
        *PRESETS["cpu"].model, "--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers),
        "--lr", f"{args.lr:g}", "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(args.warmup),
        "--total-num-update", str(total), "--end-learning-rate", "0", *VARIANTS["deepnorm"], "--seed", str(args.seed),
    ]  # fmt: skip


def train_iterator(cfg, task, model):
    """fairseq's epoch iterator over the training batches, as Trainer.get_train_iterator builds it for
    one process at epoch 1 (no loader workers: the same batches, made in this process)."""
    from fairseq import utils

    data = cfg.dataset
    return task.get_batch_iterator(
        dataset=task.dataset(data.train_subset),
        max_tokens=data.max_tokens,
        max_sentences=data.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), data.max_tokens),
        ignore_invalid_inputs=True,
        seed=(cfg.common.seed + 1) if data.update_ordered_indices_seed else cfg.common.seed,
        disable_iterator_cache=True,  # a fresh iterator at epoch 1 each call
        required_batch_size_multiple=data.required_batch_size_multiple,
        data_buffer_size=data.data_buffer_size,
        skip_remainder_batch=cfg.optimization.skip_remainder_batch,
        grouped_shuffling=data.grouped_shuffling,
        update_epoch_batch_itr=data.update_epoch_batch_itr,
    )


# --- the forward check --------------------------------------------------------------------------------


def logits_difference(plugin, torchscale, sample, pad: int, encoder: bool = True) -> dict:
    """Max |plugin − torchscale| of the logits at the real target positions, and (*encoder*) of the
    encoder output at the real source positions. In the models' current mode: with dropout on, both
    passes draw from the same generator state."""
    net_input = sample["net_input"]
    rng = torch.get_rng_state()
    ours = plugin(**net_input)[0]
    torch.set_rng_state(rng)
    theirs = torchscale(**net_input)[0]
    real = sample["target"].ne(pad)
    out = {"logits": float((ours - theirs)[real].abs().max()), "logit_scale": float(ours[real].abs().max())}
    if encoder:
        with torch.no_grad():
            src = net_input["src_tokens"]
            mine, theirs = (m.encoder(src, net_input["src_lengths"])["encoder_out"][0] for m in (plugin, torchscale))
        out["encoder_out"] = float((mine - theirs)[src.ne(pad).t()].abs().max())
    return out


def forward_check(plugin, torchscale, pairs, task, cfg, criterion, args, batches_checked=8):
    """The two models' passes compared: eval mode on the first *batches_checked* batches of --subset;
    train mode (dropout on, one seed) on the first training batch, with its loss and gradients, and
    with torchscale's own (batch-major) dropout masks."""
    from fairseq import utils

    pad = task.source_dictionary.pad()
    plugin.eval(), torchscale.eval()
    worst = {"logits": 0.0, "logit_scale": 0.0, "encoder_out": 0.0}
    with torch.no_grad():
        for _, sample in zip(range(batches_checked), batches(plugin, task, args.subset, args.max_tokens)):
            d = logits_difference(plugin, torchscale, sample, pad)
            worst = {k: max(worst[k], d[k]) for k in worst}
    sample = next(iter(train_iterator(cfg, task, plugin).next_epoch_itr(shuffle=True)))
    unaligned = build_torchscale(plugin.args, task.source_dictionary, align_dropout=False)
    copy_weights(plugin, unaligned)
    plugin.train(), torchscale.train(), unaligned.train()
    with torch.no_grad():
        utils.set_torch_seed(args.seed)
        train_mode = logits_difference(plugin, torchscale, sample, pad, encoder=False)
        utils.set_torch_seed(args.seed)
        batch_major = logits_difference(plugin, unaligned, sample, pad, encoder=False)["logits"]
    losses = []
    for model in (plugin, torchscale):
        model.zero_grad(set_to_none=True)
        utils.set_torch_seed(args.seed)
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        losses.append(float(loss.detach()) / sample_size / math.log(2))
    grad = max(float((a.grad - b.grad).abs().max()) for _, a, _, b in pairs)
    grad_scale = max(float(a.grad.abs().max()) for _, a, _, _ in pairs)
    for model in (plugin, torchscale):
        model.zero_grad(set_to_none=True)
    return {
        "eval": {**worst, "batches": batches_checked, "subset": args.subset},
        "train_mode_dropout_on": {
            **train_mode,
            "loss_plugin": losses[0],
            "loss_torchscale": losses[1],
            "grad_max_abs_difference": grad,
            "grad_max_abs": grad_scale,
            "logits_with_batch_major_dropout_masks": batch_major,
        },
    }


def structural_ablations(plugin, task, args) -> dict:
    """How far the logits move when torchscale's model is built or called with its own defaults
    instead of the settings above (eval mode, first batch of --subset): each is a difference a
    straight use of torchscale would have."""
    dictionary = task.source_dictionary
    sample = next(iter(batches(plugin, task, args.subset, args.max_tokens)))
    net_input, real = sample["net_input"], sample["target"].ne(dictionary.pad())
    mapped, unscaled, gelu = (build_torchscale(plugin.args, dictionary) for _ in range(3))
    for stack in (unscaled.ts.encoder, unscaled.ts.decoder):
        stack.embed_scale = 1.0
    for layer in [*gelu.ts.encoder.layers, *gelu.ts.decoder.layers]:
        layer.ffn.activation_fn = F.gelu
    src, prev = net_input["src_tokens"], net_input["prev_output_tokens"]
    calls = {
        "as mapped": lambda: mapped(**net_input),
        "EncoderDecoder.forward (no padding masks)": lambda: mapped.ts(src, prev),
        "no_scale_embedding=True (the config's default)": lambda: unscaled(**net_input),
        "activation_fn gelu (the config's default)": lambda: gelu(**net_input),
    }
    with torch.no_grad():
        ours = plugin.eval()(**net_input)[0]
        for model in (mapped, unscaled, gelu):
            copy_weights(plugin, model)
            model.eval()
        return {name: float((ours - call()[0])[real].abs().max()) for name, call in calls.items()}


# --- training ----------------------------------------------------------------------------------------


def measured(model, task, criterion, subset, max_tokens) -> dict:
    """source_use.measure of *model* on *subset*, with the label-smoothed loss beside it (bits)."""
    logged = []  # measure calls the criterion on each batch, then on its impostor: the own ones are [::2]

    def recorded(model, sample):
        loss, sample_size, logging_output = criterion(model, sample)
        logged.append(logging_output)
        return loss, sample_size, logging_output

    m = measure(model, task, recorded, subset, max_tokens)
    model.train()
    own = logged[::2]
    return {
        "valid_loss": rounded(sum(float(o["loss"]) for o in own) / sum(int(o["ntokens"]) for o in own) / math.log(2)),
        "valid_nll": rounded(m["nll_own"]),
        "nll_impostor": rounded(m["nll_impostor"]),
        "source_use": rounded(m["nll_impostor"] - m["nll_own"]),
        "spread_output": rounded(m["spread"][-1]),
        "spread": rounded(m["spread"]),
    }


class Arm:
    """One model in training, with fairseq's optimizer and schedule as fairseq's Trainer makes them."""

    def __init__(self, name, model, cfg):
        from fairseq import optim
        from fairseq.optim import lr_scheduler

        self.name, self.model, self.clip_norm = name, model, cfg.optimization.clip_norm
        self.optimizer = optim.build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
        self.scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, self.optimizer)
        self.scheduler.step_update(0)  # Trainer.__init__
        self.window, self.last = [], {}  # window: (loss, target tokens) of each update since the last row

    def begin_epoch(self, epoch, updates):  # Trainer.lr_step_begin_epoch
        self.scheduler.step_begin_epoch(epoch)
        self.scheduler.step_update(updates)

    def step(self, sample, criterion, updates: int, seed: int):
        """One update as Trainer.train_step makes it (one batch, one process, float32); its loss in bits."""
        from fairseq import utils

        utils.set_torch_seed(seed + updates)
        self.model.train()
        criterion.train()
        self.optimizer.zero_grad()
        if hasattr(self.model, "set_num_updates"):
            self.model.set_num_updates(updates)
        loss, sample_size, logged = criterion(self.model, sample)
        self.optimizer.backward(loss)
        self.optimizer.multiply_grads(1.0 / float(sample_size or 1.0))
        grad_norm = self.optimizer.clip_grad_norm(self.clip_norm)
        if not torch.isfinite(grad_norm).all():
            raise FloatingPointError(f"{self.name}: gradients are Nan/Inf at update {updates + 1}")
        self.optimizer.step()
        self.scheduler.step_update(updates + 1)
        bits = float(logged["loss"]) / float(sample_size) / math.log(2)
        self.window.append((bits, float(sample_size)))
        self.last = {"loss": bits, "gnorm": float(grad_norm)}
        return bits


def train(arms, task, cfg, criterion, args, pairs=None, on_row=None):
    """Train every arm on the same batches; a row of measurements every --every updates, at each
    epoch's end (where fairseq-train validates and saves) and at 0, each handed to
    *on_row(rows, losses, seconds)* as it is made."""
    iterator = train_iterator(cfg, task, arms[0].model)
    rows, losses, start = [], {arm.name: [] for arm in arms}, time.time()

    def row(updates):
        r = {"updates": updates, "epoch": iterator.epoch if updates else 0, "lr": arms[0].optimizer.get_lr()}
        for arm in arms:
            window, arm.window = arm.window, []
            tokens = sum(n for _, n in window)  # the loss since the last row: its mean, weighted by tokens
            r[arm.name] = {
                "train_loss": rounded(sum(bits * n for bits, n in window) / tokens if tokens else None),
                "train_loss_update": rounded(arm.last.get("loss")),
                "gnorm": rounded(arm.last.get("gnorm")),
                **measured(arm.model, task, criterion, args.subset, args.max_tokens),
            }
        cells = [updates, f"{time.time() - start:.0f}"]
        for m in map(r.get, (arm.name for arm in arms)):
            loss = "" if m["train_loss"] is None else f"{m['train_loss']:.3f}"
            cells += [loss, f"{m['valid_nll']:.3f}", f"{m['spread_output']:.3f}", f"{m['source_use']:+.3f}"]
        if pairs is not None:
            r["max_param_difference"] = max(float((mine - theirs).abs().max()) for _, mine, _, theirs in pairs)
            cells.append(f"{r['max_param_difference']:.2e}")
        rows.append(r)
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        if on_row is not None:
            on_row(rows, losses, time.time() - start)

    columns = ["updates", "seconds"] + [
        f"{a.name} {c}" for a in arms for c in ("loss", "val NLL", "spread", "source use")
    ]
    columns += ["max Δθ"] if pairs is not None else []
    print(f"\n| {' | '.join(columns)} |\n|" + "---|" * len(columns), flush=True)
    row(0)
    updates = 0
    while updates < args.updates:
        epoch_itr = iterator.next_epoch_itr(shuffle=True)  # train.py: shuffled from epoch 1 (no curriculum)
        for arm in arms:
            arm.begin_epoch(iterator.epoch, updates)
        for sample in epoch_itr:
            for arm in arms:
                losses[arm.name].append(round(arm.step(sample, criterion, updates, cfg.common.seed), 5))
            updates += 1
            if updates % args.every == 0 or updates == args.updates or not epoch_itr.has_next():
                row(updates)
            if updates == args.updates:
                break
    return rows, losses, time.time() - start


UNITS = {
    "train_loss": "label-smoothed loss, bits per target token, mean over the updates since the last row (weighted "
    "by target tokens, as fairseq logs it)",
    "train_loss_update": "the same, of the row's last update alone",
    "gnorm": "gradient norm of the row's last update (after dividing by its target tokens)",
    "valid_loss": "label-smoothed, bits per target token, on the whole subset, dropout off",
    "valid_nll": "NLL in bits per target token, own source",
    "source_use": "NLL with the batch neighbour's source minus with its own (bits)",
    "spread": "E|x - mean|^2 / E|x|^2 over real source tokens: embedding, encoder layers 1..N, output",
    "max_param_difference": "max |plugin - torchscale| over paired parameters",
}


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import_plugin()
    with exit_on_failure(PROG):
        _, _, version = import_torchscale()
        if not (args.data / "dict.en.txt").exists():
            raise InputError(f"{args.data}: no binarised en-de data (--data)")
    from fairseq import utils

    cfg, task = training_task(study_flags(args, total=0), args.subset)  # total: set below, from the data
    plugin = fresh_model(task, cfg)  # fairseq-train's seeding, then task.build_model
    upe = len(train_iterator(cfg, task, plugin))
    total = cfg.lr_scheduler.total_num_update = args.epochs * upe
    flags = study_flags(args, total)
    criterion = task.build_criterion(cfg.criterion)
    dictionary, model_args = task.source_dictionary, plugin.args  # the flags with the architecture's defaults

    torchscale = build_torchscale(model_args, dictionary)
    pairs = parameter_pairs(plugin, torchscale)
    copy_weights(plugin, torchscale, pairs)  # the plugin's initial weights into torchscale's model
    alpha = {
        "plugin": {side: getattr(plugin, side).layers[0].residual_alpha for side in ("encoder", "decoder")},
        "torchscale": {side: getattr(torchscale.ts, side).layers[0].alpha for side in ("encoder", "decoder")},
    }
    print(f"[{PROG}] torchscale {version}; {len(pairs)} parameters paired; α {alpha}", flush=True)
    check = forward_check(plugin, torchscale, pairs, task, cfg, criterion, args)
    check["structural_ablations_max_abs_logit_difference"] = structural_ablations(plugin, task, args)
    print(f"[{PROG}] forward check: {check}", flush=True)
    if args.check_only:
        return check

    models, arms = {"plugin": plugin, "torchscale": torchscale}, []
    for name in args.arms:
        if name not in models:  # torchscale-own-init: its own draw, its own DeepNorm scaling
            utils.set_torch_seed(args.seed)
            models[name] = build_torchscale(model_args, dictionary)
        arms.append(Arm(name, models[name], cfg))
    both = pairs if {"plugin", "torchscale"} <= set(args.arms) else None
    default = REPO / "studies" / "results" / f"cpu-deepnorm-vs-torchscale-{args.layers}-multi30k-en-de.json"
    path = Path(args.json or default)
    settings = {
        "data": repo_relative(args.data),
        **{k: getattr(args, k) for k in ("layers", "lr", "seed", "warmup")},
        "total_num_update": total,
        "updates_per_epoch": upe,
        **{k: getattr(args, k) for k in ("updates", "arms", "subset")},
        "fairseq_train_flags": [repo_relative(f) if os.path.isabs(f) else f for f in flags],
        "init": "the plugin's (fresh_model: fairseq-train's seeding), copied into torchscale's model; "
        "torchscale-own-init: torchscale's own, drawn from --seed",
        "alpha": alpha,
    }

    def save(rows, losses, seconds, complete=False):  # after every row: a stopped run keeps what it measured
        content = dict(torchscale=version, threads=args.threads, seconds=round(seconds), complete=complete)
        content.update(settings=settings, units=UNITS, forward_check=check, rows=rows, train_loss_per_update=losses)
        write_result(path, __file__, argv, device="cpu", **content)

    rows, losses, seconds = train(arms, task, cfg, criterion, args, both, on_row=save)
    save(rows, losses, seconds, complete=True)
    print(f"[{PROG}] wrote {repo_relative(path)}")
    return rows


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    main()
