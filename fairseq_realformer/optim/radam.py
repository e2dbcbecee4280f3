"""``--optimizer radam``: RAdam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate
and Beyond"), Adam with a rectified variance term that makes a learning-rate warm-up unnecessary.
Transformer-Clinic's ADMIN recipes train with it from a separate user dir; with this plugin the
same command lines run unchanged (``--optimizer radam --adam-betas '(0.9, 0.98)' --adam-eps 1e-8
--weight-decay W``).

``torch.optim.RAdam`` does the work, with decoupled weight decay (``p ← p − lr·W·p``, as fairseq's
Adam and Clinic's RAdam). Where torch's RAdam and Clinic's differ: in the first steps, while the
variance is not yet tractable (ρ_t ≤ 5), torch takes plain momentum steps, Clinic's takes none;
and torch adds ε to the bias-corrected √v, Clinic's to the raw √v.

Under ``--fp16``/``--bf16`` fairseq's FP16Optimizer keeps float32 master weights and gives them
to this optimizer; ``--memory-efficient-fp16`` is not supported (torch's RAdam would update half
precision weights in half precision), and fairseq says so.
"""

import ast
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf


@dataclass
class FairseqRAdamConfig(FairseqDataclass):
    # the flag names of fairseq's Adam, so that Adam and Clinic's RAdam command lines run as they are
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for RAdam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    """fairseq's wrapper of ``torch.optim.RAdam`` (state, learning-rate schedule, checkpoints)."""

    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, decoupled_weight_decay=True, **self.optimizer_config)

    @property
    def optimizer_config(self):
        """What overrides the values stored in a checkpoint when training resumes (fairseq's
        contract: e.g. a new learning rate)."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas
        betas = (
            ast.literal_eval(betas)
            if isinstance(betas, str)
            else OmegaConf.to_container(betas)
            if OmegaConf.is_config(betas)
            else betas
        )
        return {"lr": lr, "betas": tuple(betas), "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}
