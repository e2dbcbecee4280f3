"""Is DeepNorm's collapse the plugin's or the method's? The plugin's ``--backbone deepnorm`` model
and torchscale's (the DeepNet authors' library) ``EncoderDecoder(deepnorm=True)``, built at the same
size, given the same initial weights, checked to compute the same forward pass, then trained side by
side on the same Multi30k batches with the same optimizer, schedule, loss and dropout masks, and
measured every few updates as studies/source_use.py measures a checkpoint.

    pip install --no-deps torchscale fairscale==0.4.0   # a study tool, not a requirement (see below)
    pip uninstall -y torchscale fairscale               # after: see below
    python studies/deepnorm_vs_torchscale.py --check-only                 # the forward passes only
    python studies/deepnorm_vs_torchscale.py                              # 4+4, lr 2e-3, seed 1, 660 updates
    python studies/deepnorm_vs_torchscale.py --layers 18 --lr 1e-3 --updates 200
    python studies/deepnorm_vs_torchscale.py --arms plugin,torchscale,torchscale-own-init

The plugin's model is built as the study builds it: fairseq's parser with the flags the study gives
fairseq-train (examples/multi30k/run.sh's, common/presets.py's "cpu" preset, the variant's
``--residual-attention-paths none --backbone deepnorm``), from --seed, on --data. torchscale's model
takes fairseq's token embedding (shared by encoder, decoder and output, as --share-all-embeddings)
and fairseq's sinusoidal positions, as torchscale's own fairseq example (examples/fairseq/models/
machine_translation.py) builds its MT model, with that example's settings: the embeddings scaled by
√d (``no_scale_embedding=False``; the config's default is True), ReLU, the source and target padding
masks handed to the encoder and decoder (``EncoderDecoder.forward`` hands neither). The plugin's
initial weights are then copied into torchscale's model, parameter for parameter (the only renaming:
a layer's ``fc1``/``fc2`` are ``ffn.fc1``/``ffn.fc2`` there): the plugin's initialisation is the one
whose training collapsed, so both start from it, and any difference in training is one of structure,
not of the draw. ``torchscale-own-init`` adds torchscale's model with torchscale's own initialisation
(drawn from --seed: PyTorch's default Linear initialisation, since its attention never calls its
``reset_parameters``, then its DeepNorm scaling, whose encoder β is 1.15·(N⁴M)^(−1/16) where the
paper has 0.87).

Training is a hand loop over fairseq's own batch iterator (the study's batches in the study's
order, epoch by epoch), for each model in turn, as fairseq's Trainer steps: the dropout seed
--seed + updates before each update, the label-smoothed loss summed over the batch, gradients
divided by its target tokens, no clipping (the recipe's --clip-norm is fairseq's default 0),
fairseq's Adam and its polynomial_decay schedule (warm-up from 0 over --warmup updates, then
linear to 0 at 20 epochs' updates, as the "cpu" preset). torchscale's tensors are batch-major,
fairseq's time-major: its layers' dropout draws its mask on the time-major layout, so that the same
seed drops the same units in both models.

Every --every updates and at each epoch's end (where the study's fairseq-train validated and saved
the checkpoints that source_use.py measured), each model on --subset (all of it, in fairseq's
validation order): the label-smoothed and plain (NLL) loss in bits per target token, the NLL with
each source swapped for its batch neighbour's, and the token spread of the encoder after the
embedding, each layer and at the output (source_use.py's measure: E‖x − x̄‖² / E‖x‖² over the real
source tokens).

torchscale 0.3.0 imports fairscale (which installs without its dependencies) and timm (for its
drop-path, which needs torchvision, a binary built for one torch): when timm cannot be imported, a
stand-in for ``timm.models.layers.drop_path`` is registered that refuses to run; drop-path is off
(``drop_path_rate`` 0), so it is never called. Uninstall both when done: with fairscale installed
fairseq imports it, and fairseq-train processes of the test suite (tests/test_fast_update.py)
aborted at exit ("terminate called without an active exception", 6 errors; 9 passed once it was
uninstalled, 2026-12-01).
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: common/ and studies/
from common.presets import PRESETS
from common.repo import REPO, USER_DIR, VARIANTS, repo_relative, write_result
from studies.checkpoints import InputError, batches, import_plugin

PROG = "deepnorm_vs_torchscale.py"
INSTALL = "pip install --no-deps torchscale fairscale==0.4.0"
DEFAULT_DATA = REPO / "runs" / "depth-18" / "data" / "bin"
ARMS = ("plugin", "torchscale", "torchscale-own-init")
RECIPE_ARCH = "realformer_iwslt_de_en"
UPDATES_PER_EPOCH = 132  # of the study's data at --max-tokens 4096 (runs/depth-18/data/updates_per_epoch)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA), help="binarised en-de data (default: %(default)s)")
    p.add_argument("--layers", type=int, default=4, help="encoder and decoder layers (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="initialisation and dropout seed (default: %(default)s)")
    p.add_argument("--updates", type=int, default=660, help="updates to train (default: %(default)s, 5 epochs)")
    p.add_argument("--every", type=int, default=25, help="measure every N updates (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=PRESETS["cpu"].warmup, help="warm-up updates (default: %(default)s)")
    p.add_argument(
        "--epochs",
        type=int,
        default=PRESETS["cpu"].epochs,
        help="the schedule's length in epochs: the rate reaches 0 after this many (default: %(default)s)",
    )
    p.add_argument("--subset", default="valid", help="the split measured (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument(
        "--arms", default="plugin,torchscale", help=f"models to train, of {', '.join(ARMS)} (default: %(default)s)"
    )
    p.add_argument("--check-only", action="store_true", help="only build the models and compare their passes")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the result here (default: studies/results/cpu-deepnorm-vs-"
        "torchscale-LAYERS-multi30k-en-de.json; with --check-only, none)",
    )
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.arms:
        p.error(f"--arms: unknown {', '.join(unknown) or 'nothing given'}; choose from {', '.join(ARMS)}")
    for flag in ("layers", "updates", "every", "threads", "epochs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    return args


# --- torchscale -------------------------------------------------------------------------------------


def import_torchscale():
    """torchscale's EncoderDecoder and its config, and its version; InputError saying how to install
    it. timm (for drop-path only) gets a stand-in when it cannot be imported (see the docstring)."""
    import importlib.metadata
    import types

    try:
        import timm.models.layers
    except Exception:  # absent, or present without torchvision
        for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
            del sys.modules[name]

        def drop_path(*_, **__):
            raise NotImplementedError("timm stand-in (deepnorm_vs_torchscale.py): drop-path is off here")

        layers = types.ModuleType("timm.models.layers")
        layers.drop_path = drop_path
        timm, models = types.ModuleType("timm"), types.ModuleType("timm.models")
        timm.models, models.layers = models, layers
        sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})
    try:
        from torchscale.architecture.config import EncoderDecoderConfig
        from torchscale.architecture.encoder_decoder import EncoderDecoder
    except ModuleNotFoundError as e:
        raise InputError(f"torchscale cannot be imported ({e}): {INSTALL}") from None
    return EncoderDecoder, EncoderDecoderConfig, importlib.metadata.version("torchscale")


def torchscale_config(args, vocab_size: int):
    """torchscale's EncoderDecoderConfig for the fairseq model of *args* (a fairseq Namespace),
    with torchscale's fairseq example's settings; ValueError where the fairseq model has a part that
    this mapping does not build."""
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
    return EncoderDecoderConfig(
        deepnorm=True,  # sets Post-LN and no sub-LayerNorm
        encoder_embed_dim=args.encoder_embed_dim,
        encoder_ffn_embed_dim=args.encoder_ffn_embed_dim,
        encoder_attention_heads=args.encoder_attention_heads,
        encoder_layers=args.encoder_layers,
        decoder_embed_dim=args.decoder_embed_dim,
        decoder_ffn_embed_dim=args.decoder_ffn_embed_dim,
        decoder_attention_heads=args.decoder_attention_heads,
        decoder_layers=args.decoder_layers,
        activation_fn=args.activation_fn,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        no_scale_embedding=False,  # fairseq scales by √d; torchscale's config does not by default
        layernorm_embedding=False,
        share_all_embeddings=True,
        vocab_size=vocab_size,
        max_source_positions=args.max_source_positions,
        max_target_positions=args.max_target_positions,
        layernorm_eps=1e-5,  # fairseq's LayerNorm
    )


def time_major_dropout(module):
    """*module* (an ``nn.Dropout``) drawing its mask on the time-major (T x B x C) layout fairseq's
    layers drop on, for its batch-major input: the same seed then drops the same units."""
    import torch.nn.functional as F
    from torch import nn

    class TimeMajorDropout(nn.Dropout):
        def forward(self, x):
            if not self.training or self.p == 0:
                return x
            return F.dropout(x.transpose(0, 1).contiguous(), self.p, True).transpose(0, 1)

    return TimeMajorDropout(module.p)


def build_torchscale(args, dictionary, align_dropout: bool = True):
    """torchscale's DeepNorm EncoderDecoder for the fairseq model of *args*, in a wrapper that
    fairseq's criterion, batches and source_use.measure take as a fairseq model."""
    from fairseq import utils
    from fairseq.models.transformer import Embedding
    from fairseq.modules import PositionalEmbedding
    from torch import nn

    EncoderDecoder, _, _ = import_torchscale()
    config = torchscale_config(args, len(dictionary))
    pad = dictionary.pad()

    class TorchscaleTranslation(nn.Module):
        """torchscale's model as torchscale's fairseq example calls it (padding masks given),
        answering as a fairseq encoder-decoder: logits B x T x V, and ``encoder()``'s states T x B x C."""

        def __init__(self):
            super().__init__()
            embed = Embedding(len(dictionary), config.encoder_embed_dim, pad)  # fairseq's N(0, d^-1/2)
            positions = [
                PositionalEmbedding(n, config.encoder_embed_dim, pad, learned=False)
                for n in (config.max_source_positions, config.max_target_positions)
            ]
            self.ts = EncoderDecoder(
                config,
                encoder_embed_tokens=embed,
                encoder_embed_positions=positions[0],
                decoder_embed_positions=positions[1],
            )
            self.pad = pad

        def forward(self, src_tokens, src_lengths=None, prev_output_tokens=None, **_):
            encoder_out = self.ts.encoder(src_tokens, encoder_padding_mask=src_tokens.eq(self.pad))
            return self.ts.decoder(
                prev_output_tokens, self_attn_padding_mask=prev_output_tokens.eq(self.pad), encoder_out=encoder_out
            )

        def encoder(self, src_tokens, src_lengths=None, return_all_hiddens=False):
            out = self.ts.encoder(src_tokens, encoder_padding_mask=src_tokens.eq(self.pad), return_all_hiddens=True)
            return {
                "encoder_out": [out["encoder_out"].transpose(0, 1)],
                "encoder_states": [x.transpose(0, 1) for x in out["encoder_states"]] if return_all_hiddens else [],
                "encoder_padding_mask": [out["encoder_padding_mask"]],
            }

        def get_normalized_probs(self, net_output, log_probs, sample=None):
            logits = net_output[0]
            return utils.log_softmax(logits, dim=-1) if log_probs else utils.softmax(logits, dim=-1)

        def get_targets(self, sample, net_output):
            return sample["target"]

        def max_positions(self):
            return (config.max_source_positions, config.max_target_positions)

    model = TorchscaleTranslation()
    if align_dropout:
        for stack in (model.ts.encoder, model.ts.decoder):
            for layer in stack.layers:
                layer.dropout_module = time_major_dropout(layer.dropout_module)
                layer.ffn.dropout_module = time_major_dropout(layer.ffn.dropout_module)
    return model


def torchscale_name(plugin_name: str) -> str:
    """The torchscale parameter that the plugin's *plugin_name* maps to (inside the wrapper)."""
    for fc in ("fc1", "fc2"):
        plugin_name = plugin_name.replace(f".{fc}.", f".ffn.{fc}.")
    return "ts." + plugin_name


def parameter_pairs(plugin, torchscale):
    """[(plugin name, plugin parameter, torchscale name, torchscale parameter)], one-to-one over every
    parameter of both (tied ones once); ValueError naming any parameter left unpaired or misshapen."""
    theirs = dict(torchscale.named_parameters())
    pairs, missing = [], []
    for name, p in plugin.named_parameters():
        other = theirs.pop(torchscale_name(name), None)
        if other is None or other.shape != p.shape:
            missing.append(name)
        else:
            pairs.append((name, p, torchscale_name(name), other))
    if missing or theirs:
        raise ValueError(f"unpaired: plugin {missing}, torchscale {sorted(theirs)}")
    return pairs


def copy_weights(source, target, pairs, plugin_to_torchscale: bool = True) -> None:
    """Copy every paired parameter from the plugin's model into torchscale's (or the reverse)."""
    import torch

    with torch.no_grad():
        for _, mine, _, theirs in pairs:
            (theirs if plugin_to_torchscale else mine).copy_(mine if plugin_to_torchscale else theirs)


def max_parameter_difference(pairs) -> float:
    return max(float((mine - theirs).abs().max()) for _, mine, _, theirs in pairs)


# --- the plugin's model, the study's way ------------------------------------------------------------


def study_flags(data, layers: int, lr: float, seed: int, warmup: int, total: int, max_tokens: int):
    """fairseq-train's arguments as the study gives them (run.sh's, the preset's, the variant's)."""
    preset = PRESETS["cpu"]
    return [
        str(data), "--user-dir", str(USER_DIR), "--arch", RECIPE_ARCH, "--source-lang", "en", "--target-lang", "de",
        "--share-all-embeddings", "--dropout", "0.3",
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "1000", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(max_tokens), "--seed", "1",
        # quality.py's flags after run.sh's: the preset's model and schedule, then the variant's
        *preset.model, "--encoder-layers", str(layers), "--decoder-layers", str(layers),
        "--lr", f"{lr:g}", "--warmup-updates", str(warmup),
        "--lr-scheduler", "polynomial_decay", "--total-num-update", str(total), "--end-learning-rate", "0",
        *VARIANTS["deepnorm"], "--seed", str(seed),
    ]  # fmt: skip


def setup(flags, subset: str):
    """(fairseq cfg, args, task) of *flags*, with the training data and *subset* loaded."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, epoch=1, combine=True)
    task.load_dataset(subset, combine=False, epoch=1)
    return cfg, args, task


def train_iterator(cfg, task, model):
    """fairseq's epoch iterator over the training batches, as Trainer.get_train_iterator builds it
    for one process (no loader workers: the same batches, made in this process)."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset),
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), cfg.dataset.max_tokens),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=(cfg.common.seed + 1) if cfg.dataset.update_ordered_indices_seed else cfg.common.seed,
        num_shards=1,
        shard_id=0,
        num_workers=0,
        epoch=1,
        disable_iterator_cache=True,  # a fresh iterator at epoch 1 each call
        data_buffer_size=cfg.dataset.data_buffer_size,
        skip_remainder_batch=cfg.optimization.skip_remainder_batch,
        grouped_shuffling=cfg.dataset.grouped_shuffling,
        update_epoch_batch_itr=cfg.dataset.update_epoch_batch_itr,
    )


# --- the forward check --------------------------------------------------------------------------------


def logits_difference(plugin, torchscale, sample, pad: int, encoder: bool = True) -> dict:
    """Max |plugin − torchscale| of the logits at the real target positions, and (*encoder*) of the
    encoder output at the real source positions. In the models' current mode: with dropout on, both
    passes draw from the same generator state."""
    import torch

    net_input = sample["net_input"]
    rng = torch.get_rng_state()
    ours = plugin(**net_input)[0]
    torch.set_rng_state(rng)
    theirs = torchscale(**net_input)[0]
    real = sample["target"].ne(pad)
    out = {"logits": float((ours - theirs)[real].abs().max()), "logit_scale": float(ours[real].abs().max())}
    if encoder:
        with torch.no_grad():
            encoded = [
                m.encoder(net_input["src_tokens"], net_input["src_lengths"])["encoder_out"][0]
                for m in (plugin, torchscale)
            ]
        out["encoder_out"] = float((encoded[0] - encoded[1])[net_input["src_tokens"].ne(pad).t()].abs().max())
    return out


def forward_check(plugin, torchscale, pairs, task, cfg, criterion, subset, max_tokens, seed, batches_checked=8):
    """The two models' passes compared: eval mode on the first *batches_checked* batches of *subset*;
    train mode (dropout on, one seed) on the first training batch, with its loss and gradients."""
    import torch
    from fairseq import utils

    pad = task.source_dictionary.pad()
    plugin.eval(), torchscale.eval()
    worst = {"logits": 0.0, "logit_scale": 0.0, "encoder_out": 0.0}
    with torch.no_grad():
        for i, sample in enumerate(batches(plugin, task, subset, max_tokens)):
            if i == batches_checked:
                break
            d = logits_difference(plugin, torchscale, sample, pad)
            worst = {k: max(worst[k], d[k]) for k in worst}
    sample = next(iter(train_iterator(cfg, task, plugin).next_epoch_itr(shuffle=True)))
    plugin.train(), torchscale.train()
    with torch.no_grad():
        utils.set_torch_seed(seed)
        train_mode = logits_difference(plugin, torchscale, sample, pad, encoder=False)
    losses = []
    for model in (plugin, torchscale):
        model.zero_grad(set_to_none=True)
        utils.set_torch_seed(seed)
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        losses.append(float(loss.detach()) / sample_size / math.log(2))
    grad = max(float((a.grad - b.grad).abs().max()) for _, a, _, b in pairs)
    unaligned = build_torchscale(plugin.args, task.source_dictionary, align_dropout=False)
    copy_weights(plugin, unaligned, parameter_pairs(plugin, unaligned))
    unaligned.train()
    with torch.no_grad():
        utils.set_torch_seed(seed)
        batch_major = logits_difference(plugin, unaligned, sample, pad, encoder=False)["logits"]
    grad_scale = max(float(a.grad.abs().max()) for _, a, _, _ in pairs)
    for model in (plugin, torchscale):
        model.zero_grad(set_to_none=True)
    return {
        "eval": {**worst, "batches": batches_checked, "subset": subset},
        "train_mode_dropout_on": {
            **train_mode,
            "loss_plugin": losses[0],
            "loss_torchscale": losses[1],
            "grad_max_abs_difference": grad,
            "grad_max_abs": grad_scale,
            "logits_with_batch_major_dropout_masks": batch_major,
        },
    }


def structural_ablations(plugin, args, dictionary, task, subset, max_tokens, pairs_of) -> dict:
    """How far the logits move when torchscale's model is built or called with its own defaults
    instead of the settings above (eval mode, first batch of *subset*): each is a difference a
    straight use of torchscale would have."""
    import torch

    pad = dictionary.pad()
    sample = next(iter(batches(plugin, task, subset, max_tokens)))
    net_input = sample["net_input"]
    real = sample["target"].ne(pad)
    plugin.eval()
    with torch.no_grad():
        ours = plugin(**net_input)[0]
    out = {}

    def compare(name, model, call):
        copy_weights(plugin, model, pairs_of(model))
        model.eval()
        with torch.no_grad():
            out[name] = float((ours - call(model))[real].abs().max())

    base = build_torchscale(args, dictionary)
    compare("as mapped", base, lambda m: m(**net_input)[0])
    compare(
        "EncoderDecoder.forward (no padding masks)",
        base,
        lambda m: m.ts(net_input["src_tokens"], net_input["prev_output_tokens"])[0],
    )
    unscaled = build_torchscale(args, dictionary)
    for stack in (unscaled.ts.encoder, unscaled.ts.decoder):
        stack.embed_scale = 1.0
    compare("no_scale_embedding=True (the config's default)", unscaled, lambda m: m(**net_input)[0])
    gelu = build_torchscale(args, dictionary)
    import torch.nn.functional as F

    for stack in (gelu.ts.encoder, gelu.ts.decoder):
        for layer in stack.layers:
            layer.ffn.activation_fn = F.gelu
    compare("activation_fn gelu (the config's default)", gelu, lambda m: m(**net_input)[0])
    return out


# --- training ----------------------------------------------------------------------------------------


class Recorded:
    """A criterion that keeps the label-smoothed loss of the own-source batches that
    source_use.measure scores (it calls the criterion on each batch, then on its impostor)."""

    def __init__(self, criterion):
        self.criterion, self.calls, self.loss, self.tokens = criterion, 0, 0.0, 0

    def __call__(self, model, sample):
        loss, sample_size, logged = self.criterion(model, sample)
        if self.calls % 2 == 0:
            self.loss, self.tokens = self.loss + float(logged["loss"]), self.tokens + int(logged["ntokens"])
        self.calls += 1
        return loss, sample_size, logged


def measured(model, task, criterion, subset, max_tokens) -> dict:
    """source_use.measure of *model* on *subset*, with the label-smoothed loss beside it (bits)."""
    from studies.source_use import measure

    recorder = Recorded(criterion)
    m = measure(model, task, recorder, subset, max_tokens)
    model.train()
    return {
        "valid_loss": round(recorder.loss / recorder.tokens / math.log(2), 4),
        "valid_nll": round(m["nll_own"], 4),
        "nll_impostor": round(m["nll_impostor"], 4),
        "source_use": round(m["nll_impostor"] - m["nll_own"], 4),
        "spread_output": round(m["spread"][-1], 4),
        "spread": [round(v, 4) for v in m["spread"]],
    }


class Arm:
    """One model in training: fairseq's optimizer and schedule for it, as fairseq's Trainer makes them."""

    def __init__(self, name, model, cfg):
        from fairseq import optim
        from fairseq.optim import lr_scheduler

        self.name, self.model, self.cfg = name, model, cfg
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optim.build_optimizer(cfg.optimizer, params)
        self.scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, self.optimizer)
        self.scheduler.step_update(0)  # Trainer.__init__
        self.window, self.window_tokens = 0.0, 0
        self.last = {}

    def begin_epoch(self, epoch, updates):  # Trainer.lr_step_begin_epoch
        self.scheduler.step_begin_epoch(epoch)
        self.scheduler.step_update(updates)

    def step(self, sample, criterion, updates: int, seed: int):
        """One update as Trainer.train_step makes it (one batch, one process, float32)."""
        import torch
        from fairseq import utils

        utils.set_torch_seed(seed + updates)
        self.model.train()
        criterion.train()
        self.optimizer.zero_grad()
        if hasattr(self.model, "set_num_updates"):
            self.model.set_num_updates(updates)
        lr = self.optimizer.get_lr()
        loss, sample_size, logged = criterion(self.model, sample)
        self.optimizer.backward(loss)
        self.optimizer.multiply_grads(1.0 / float(sample_size or 1.0))
        grad_norm = self.optimizer.clip_grad_norm(self.cfg.optimization.clip_norm)
        if not torch.isfinite(grad_norm).all():
            raise FloatingPointError(f"{self.name}: gradients are Nan/Inf at update {updates + 1}")
        self.optimizer.step()
        self.scheduler.step_update(updates + 1)
        bits = float(logged["loss"]) / float(sample_size) / math.log(2)
        self.window += bits * float(sample_size)
        self.window_tokens += float(sample_size)
        self.last = {"loss": bits, "gnorm": float(grad_norm), "lr": lr}
        return bits

    def take_window(self):
        mean = self.window / self.window_tokens if self.window_tokens else None
        self.window, self.window_tokens = 0.0, 0
        return mean


def train(arms, task, cfg, criterion, args, pairs=None, on_row=None):
    """Train every arm on the same batches; a row of measurements every --every updates (and at 0),
    each handed to *on_row(rows, losses, seconds)* as it is made."""
    iterator = train_iterator(cfg, task, arms[0].model)
    rows, losses = [], {arm.name: [] for arm in arms}

    def row(updates, start):
        r = {"updates": updates, "epoch": iterator.epoch if updates else 0, "lr": arms[0].optimizer.get_lr()}
        for arm in arms:
            r[arm.name] = {
                "train_loss": None if not updates else round(arm.take_window(), 4),
                "train_loss_update": None if not updates else round(arm.last["loss"], 4),
                "gnorm": None if not updates else round(arm.last["gnorm"], 4),
                **measured(arm.model, task, criterion, args.subset, args.max_tokens),
            }
        if pairs is not None:
            r["max_param_difference"] = max_parameter_difference(pairs)
        rows.append(r)
        cells = "  ".join(
            f"{arm.name}: loss {r[arm.name]['train_loss'] or float('nan'):.3f} val {r[arm.name]['valid_nll']:.3f} "
            f"spread {r[arm.name]['spread_output']:.3f} use {r[arm.name]['source_use']:+.3f}"
            for arm in arms
        )
        diff = f"  Δθ {r['max_param_difference']:.2e}" if pairs is not None else ""
        print(f"[{PROG}] {updates:4d} ({time.time() - start:5.0f}s)  {cells}{diff}", flush=True)
        if on_row is not None:
            on_row(rows, losses, time.time() - start)

    start = time.time()
    row(0, start)
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
                row(updates, start)  # and at each epoch's end, where fairseq-train validates and saves
            if updates == args.updates:
                break
    return rows, losses, time.time() - start


def print_rows(rows, arms):
    print("\n| updates | " + " | ".join(f"{a} loss | {a} val NLL | {a} spread | {a} source use" for a in arms) + " |")
    print("|---|" + "---|---|---|---|" * len(arms))
    for r in rows:
        cells = []
        for a in arms:
            m = r[a]
            loss = "" if m["train_loss"] is None else f"{m['train_loss']:.3f}"
            cells += [loss, f"{m['valid_nll']:.3f}", f"{m['spread_output']:.3f}", f"{m['source_use']:+.3f}"]
        print(f"| {r['updates']} | " + " | ".join(cells) + " |")


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    import_plugin()
    try:
        _, _, version = import_torchscale()
        data = Path(args.data)
        if not (data / "dict.en.txt").exists():
            raise InputError(f"{data}: no binarised en-de data (--data)")
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    from fairseq import utils

    from studies.source_use import fresh_model

    total = args.epochs * UPDATES_PER_EPOCH
    flags = study_flags(data, args.layers, args.lr, args.seed, args.warmup, total, args.max_tokens)
    cfg, _, task = setup(flags, args.subset)
    criterion = task.build_criterion(cfg.criterion)
    plugin = fresh_model(task, cfg)  # fairseq-train's seeding, then task.build_model
    upe = len(train_iterator(cfg, task, plugin))
    if upe != UPDATES_PER_EPOCH:
        print(
            f"[{PROG}] note: {upe} updates an epoch on {data}, not {UPDATES_PER_EPOCH}: the schedule follows",
            flush=True,
        )
        total = args.epochs * upe
        flags = study_flags(data, args.layers, args.lr, args.seed, args.warmup, total, args.max_tokens)
        cfg, _, task = setup(flags, args.subset)
        plugin = fresh_model(task, cfg)
    dictionary = task.source_dictionary
    model_args = plugin.args  # the parsed flags with the architecture's defaults, as build_model set them

    torchscale = build_torchscale(model_args, dictionary)
    pairs = parameter_pairs(plugin, torchscale)
    copy_weights(plugin, torchscale, pairs)  # the plugin's initial weights into torchscale's model
    alpha_beta = {
        "plugin": {side: getattr(plugin, side).layers[0].residual_alpha for side in ("encoder", "decoder")},
        "torchscale": {side: getattr(torchscale.ts, side).layers[0].alpha for side in ("encoder", "decoder")},
    }
    print(f"[{PROG}] torchscale {version}; {len(pairs)} parameters paired; α {alpha_beta}", flush=True)
    check = forward_check(plugin, torchscale, pairs, task, cfg, criterion, args.subset, args.max_tokens, args.seed)
    check["structural_ablations_max_abs_logit_difference"] = structural_ablations(
        plugin, model_args, dictionary, task, args.subset, args.max_tokens, lambda m: parameter_pairs(plugin, m)
    )
    copy_weights(plugin, torchscale, pairs)
    print(f"[{PROG}] forward check: {check}", flush=True)
    if args.check_only:
        return check

    arms = []
    for name in args.arms:
        if name == "plugin":
            model = plugin
        elif name == "torchscale":
            model = torchscale
        else:
            utils.set_torch_seed(args.seed)
            model = build_torchscale(model_args, dictionary)  # its own draw, its own DeepNorm scaling
        arms.append(Arm(name, model, cfg))
    both = pairs if {"plugin", "torchscale"} <= set(args.arms) else None
    path = Path(
        args.json or REPO / "studies" / "results" / f"cpu-deepnorm-vs-torchscale-{args.layers}-multi30k-en-de.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    from common.host import host

    def save(rows, losses, seconds, complete=False):  # after every row: a stopped run keeps what it measured
        write_result(
            path,
            __file__,
            argv if argv is not None else sys.argv[1:],
            "cpu",
            host(),
            torchscale=version,
            threads=args.threads,
            seconds=round(seconds),
            complete=complete,
            settings={
                "data": repo_relative(data),
                "layers": args.layers,
                "lr": args.lr,
                "seed": args.seed,
                "warmup": args.warmup,
                "total_num_update": total,
                "updates_per_epoch": upe,
                "updates": args.updates,
                "arms": args.arms,
                "subset": args.subset,
                "fairseq_train_flags": [repo_relative(f) if os.path.isabs(f) else f for f in flags],
                "init": "the plugin's (fresh_model: fairseq-train's seeding), copied into torchscale's model; "
                "torchscale-own-init: torchscale's own, drawn from --seed",
                "alpha": alpha_beta,
            },
            units={
                "train_loss": "label-smoothed loss, bits per target token, mean over the updates since the last "
                "row (weighted by target tokens, as fairseq logs it)",
                "train_loss_update": "the same, of the row's last update alone",
                "gnorm": "gradient norm of the row's last update (after dividing by its target tokens)",
                "valid_loss": "label-smoothed, bits per target token, on the whole subset, dropout off",
                "valid_nll": "NLL in bits per target token, own source",
                "source_use": "NLL with the batch neighbour's source minus with its own (bits)",
                "spread": "E|x - mean|^2 / E|x|^2 over real source tokens: embedding, encoder layers 1..N, output",
                "max_param_difference": "max |plugin - torchscale| over paired parameters",
            },
            forward_check=check,
            rows=rows,
            train_loss_per_update=losses,
        )

    rows, losses, seconds = train(arms, task, cfg, criterion, args, both, on_row=save)
    save(rows, losses, seconds, complete=True)
    print_rows(rows, args.arms)
    print(f"[{PROG}] wrote {repo_relative(path)}")
    return rows


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    main()
