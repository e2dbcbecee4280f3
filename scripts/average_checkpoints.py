#!/usr/bin/env python3
"""Average the parameters of fairseq checkpoints, e.g. the last N epochs of a training run.

Takes the flags of fairseq's own scripts/average_checkpoints.py, which no fairseq wheel ships:

    python scripts/average_checkpoints.py --inputs checkpoints --num-epoch-checkpoints 5 \\
        --output checkpoints/checkpoint_avg5.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

Differences from fairseq's script, all for safety: checkpoints are loaded with
torch.load(weights_only=True) and the plugin's allow-list; the mean is accumulated in float32 and
cast back to each parameter's dtype; checkpoints of different models (parameter names, shapes,
architecture or residual-attention flags) are refused; the output is written to a temporary file
and renamed, it may never be one of the inputs, and an existing output is replaced only with
--force. The rest of the output (config, optimizer state, training counters) is the first
input's, as in fairseq; with --num-*-checkpoints that is the newest checkpoint.
"""

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Mapping

import torch
from user_error import UserError  # scripts/user_error.py

PROG = "average_checkpoints.py"
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")  # checkpoint<epoch>.pt
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt")  # checkpoint_<epoch>_<update>.pt


# checkpoint kind: its file names, and how they are written
KINDS = {"epoch": (EPOCH_CHECKPOINT, "checkpointE.pt"), "update": (UPDATE_CHECKPOINT, "checkpoint_E_U.pt")}


def numbered(folder, kind, upper_bound=None):
    """(number, file name) of the *kind* checkpoints in folder, numbered <= upper_bound if given."""
    found = []
    for name in os.listdir(folder):
        match = KINDS[kind][0].fullmatch(name)
        if match and (upper_bound is None or int(match.group(1)) <= upper_bound):
            found.append((int(match.group(1)), name))
    return found


def last_checkpoints(folder, n, by_update, upper_bound):
    """The n newest epoch (or update) checkpoints in folder, newest first."""
    kind, other = ("update", "epoch") if by_update else ("epoch", "update")
    found = numbered(folder, kind, upper_bound)
    if len(found) < n:
        bound = f" numbered <= --checkpoint-upper-bound {upper_bound}" if upper_bound is not None else ""
        held = f"holds only {len(found)} {kind} checkpoints ({KINDS[kind][1]}){bound}"
        others = len(numbered(folder, other))
        if others:  # e.g. a run saved with --save-interval-updates --no-epoch-checkpoints
            held = (
                f"holds {len(found)} {kind} checkpoints ({KINDS[kind][1]}){bound} but {others} {other} "
                f"checkpoints ({KINDS[other][1]}): use --num-{other}-checkpoints"
            )
        raise UserError(f"--num-{kind}-checkpoints {n}: {folder} {held}")
    return [os.path.join(folder, name) for _, name in sorted(found, reverse=True)[:n]]


def input_paths(args):
    """The checkpoint files the arguments name, checked to exist."""
    if args.num_epoch_checkpoints is not None or args.num_update_checkpoints is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            raise UserError("with --num-epoch-checkpoints/--num-update-checkpoints, --inputs must be one directory")
        by_update = args.num_update_checkpoints is not None
        n = args.num_update_checkpoints if by_update else args.num_epoch_checkpoints
        return last_checkpoints(args.inputs[0], n, by_update, args.checkpoint_upper_bound)
    for path in args.inputs:
        if os.path.isdir(path):
            raise UserError(
                f"--inputs {path} is a directory: give checkpoint files, or add "
                f"--num-epoch-checkpoints N / --num-update-checkpoints N"
            )
        if not os.path.isfile(path):
            raise UserError(f"--inputs {path}: no such file")
    if len(set(map(os.path.realpath, args.inputs))) != len(args.inputs):
        raise UserError("--inputs names the same checkpoint more than once")
    return args.inputs


def model_settings(state):
    """The settings of a checkpoint's model config (cfg.model, or args in old checkpoints) that
    change what the same parameters compute (the plugin's ``MODEL_FIELDS``): averaging across
    them is meaningless even when every name and shape agrees."""
    from fairseq_realformer.options import MODEL_FIELDS

    config = (state.get("cfg") or {}).get("model") or state.get("args")
    get = config.get if isinstance(config, Mapping) else lambda name: getattr(config, name, None)
    return {name: get(name) for name in MODEL_FIELDS} if config is not None else {}


def check_same_model(path, params, settings, first_path, first_params, first_settings):
    """Refuse to average a checkpoint of a different model than the first one."""
    differ = f"{first_path} and {path} are checkpoints of different models"
    if params.keys() != first_params.keys():
        only_first = sorted(first_params.keys() - params.keys())[:3]
        only_this = sorted(params.keys() - first_params.keys())[:3]
        raise UserError(f"{differ}: parameters only in the first: {only_first}, only in the second: {only_this}")
    for name, value in params.items():
        if value.shape != first_params[name].shape:
            raise UserError(
                f"{differ}: {name} has shape {tuple(first_params[name].shape)} in the first, "
                f"{tuple(value.shape)} in the second"
            )
    for name in dict.fromkeys([*first_settings, *settings]):
        if settings.get(name) != first_settings.get(name):
            raise UserError(
                f"{differ}: {name} is {first_settings.get(name)!r} in the first, {settings.get(name)!r} in the second"
            )


def load(path):
    from fairseq_realformer.errors import RealformerConfigError
    from fairseq_realformer.files.checkpoints import read_checkpoint  # imports fairseq (seconds): only when needed

    try:
        state = read_checkpoint(path)
    except RealformerConfigError as e:  # missing, damaged, not fairseq's, or a global outside the allow-list
        raise UserError(str(e)) from None
    if not isinstance(state["model"], dict):
        raise UserError(f"{path}: its 'model' is a {type(state['model']).__name__}, not a state dict")
    for name, value in state["model"].items():
        if not torch.is_tensor(value):
            raise UserError(f"{path}: model entry {name} is a {type(value).__name__}, not a tensor")
    return state


def average(paths):
    """The first checkpoint's state with its model parameters replaced by the mean over paths."""
    first, sums = None, {}
    for path in paths:
        print(f"{PROG}: reading {path}", file=sys.stderr)
        state = load(path)
        params = state["model"]
        if first is None:
            first, first_path, first_settings = state, path, model_settings(state)
        else:
            check_same_model(path, params, model_settings(state), first_path, first["model"], first_settings)
        for name, value in params.items():
            # float32 for every floating type (fp16 sums lose precision); int64 for integer buffers
            value = value.float() if value.is_floating_point() else value.long()
            sums[name] = sums[name] + value if name in sums else value.clone()
    n = len(paths)
    first["model"] = {
        name: (total / n if total.is_floating_point() else torch.div(total, n, rounding_mode="floor")).to(
            first["model"][name].dtype
        )
        for name, total in sums.items()
    }
    return first


def write(state, output):
    """Write to a temporary file next to output, then rename: no half-written output on failure."""
    folder = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(prefix=".average_checkpoints.", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it a new file's permissions
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint files to average, or one directory with --num-*-checkpoints",
    )
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the averaged checkpoint")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--num-epoch-checkpoints",
        type=int,
        metavar="N",
        help="average the last N checkpoint<epoch>.pt files of the --inputs directory",
    )
    which.add_argument(
        "--num-update-checkpoints",
        type=int,
        metavar="N",
        help="average the last N checkpoint_<epoch>_<update>.pt files of the --inputs directory",
    )
    parser.add_argument(
        "--checkpoint-upper-bound",
        type=int,
        metavar="K",
        help="with --num-*-checkpoints: only checkpoints numbered <= K (epoch or update)",
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists (never an input)")
    args = parser.parse_args(argv)
    for flag in ("num_epoch_checkpoints", "num_update_checkpoints"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if (
        args.checkpoint_upper_bound is not None
        and args.num_epoch_checkpoints is None
        and args.num_update_checkpoints is None
    ):
        parser.error("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        paths = input_paths(args)
        output = os.path.realpath(args.output)
        if output in map(os.path.realpath, paths):
            raise UserError(f"--output {args.output} is one of the inputs; choose another file")
        if os.path.exists(output) and not args.force:
            raise UserError(f"--output {args.output} exists; add --force to replace it")
        if not os.path.isdir(os.path.dirname(output)):
            raise UserError(f"--output {args.output}: folder {os.path.dirname(output)} does not exist")
        state = average(paths)
        write(state, args.output)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{PROG}: wrote the mean of {len(paths)} checkpoints to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
