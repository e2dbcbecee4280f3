"""When a training has diverged: the one definition every study uses, read from fairseq-train's log.

A run diverges when its loss is NaN or infinite (fairseq-train then stops with FloatingPointError:
gradients are Nan/Inf before it logs the loss, and saves checkpoints/crash.pt), or when its
training loss, having fallen below the first epoch's mean training loss, climbs back above it: in
a logged interval (fairseq's train_inner line, every 50 updates by default) or in an epoch. A
loss that never fell (a tiny two-epoch run) has not climbed back, and a run of one epoch cannot.
"""

import math

from common import fairseq_log

_NAN_CRASH = "FloatingPointError: gradients are Nan/Inf"  # fairseq's trainer, on a non-finite gradient norm


def divergence(lines, crash_checkpoint=None):
    """Where the training whose log is *lines* diverged: the update and why; None while it has not.
    *crash_checkpoint*: the run's checkpoints/crash.pt, which names the update a NaN stopped."""
    first, fell, last_update = None, False, 0  # fell: the loss has been below the first epoch's since
    for line in lines:
        kind, fields = fairseq_log.parse(line) or (None, None)
        if kind in ("train_inner", "train"):
            epoch, loss, update = fields["epoch"], fields["loss"], int(fields.get("num_updates", last_update))
        elif _NAN_CRASH in line:
            return {
                "update": crashed_at(crash_checkpoint, last_update),
                "reason": "the gradients are NaN or infinite (fairseq-train stopped)",
            }
        else:
            continue
        last_update = update
        if not math.isfinite(loss):
            return {"update": update, "epoch": epoch, "loss": str(loss), "reason": "the training loss is not finite"}
        if first is not None and epoch > 1:
            if loss > first and fell:
                return {
                    "update": update,
                    "epoch": epoch,
                    "loss": loss,
                    "first_epoch_loss": first,
                    "reason": "the training loss climbed back above the first epoch's",
                }
            fell = fell or loss < first
        if kind == "train" and epoch == 1:
            first = loss
    return None


def crashed_at(crash_checkpoint, last_logged_update):
    """The update whose gradients were not finite: one after crash.pt's, else the log's last."""
    if crash_checkpoint is None:
        return last_logged_update + 1
    try:
        import torch

        state = torch.load(crash_checkpoint, map_location="cpu", weights_only=False)  # written by this run
        return int(state["optimizer_history"][-1]["num_updates"]) + 1
    except (OSError, KeyError, IndexError, RuntimeError):
        return last_logged_update + 1
