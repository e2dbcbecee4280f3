"""What a lent GPU's run reads from one profiled training step (speed.py --profile): the CUDA
kernels it launched, the attention kernels among them by SDPA backend, and how much of the step
the device was busy."""

from collections import Counter

import torch

# Substrings of the CUDA kernel names of PyTorch's SDPA backends (and of eager attention's pieces).
ATTENTION_KERNELS = {
    "memory-efficient": ("fmha", "efficient_attention", "mem_efficient"),
    "flash": ("flash_fwd", "flash_bwd", "pytorch_flash"),
    "cudnn": ("cudnn", "sm90_xmma_fmha", "generated_fmha"),
}


def busy_us(spans):
    """How long the device was busy over (start, end) spans in µs: their union, so that kernels
    overlapping on two streams count once."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def cuda_kernels_of_a_training_step(bench):
    """CUDA kernels launched by one training step of *bench* (torch.profiler): how many in all,
    the ten most frequent names, the attention kernels by SDPA backend, the 40 most frequent ATen
    operators of the step (to tell which ones launched the kernels), and the device's time: how long
    it was busy (``busy_us``; against the step's timed length it says whether the step waits on the
    host) and how much of that the attention kernels took, by backend."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            bench.train_steps(1)
        counts, ops, spans, kernel_us = Counter(), Counter(), [], Counter()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                counts[event.name] += 1
                spans.append((event.time_range.start, event.time_range.end))
                kernel_us[event.name] += event.time_range.elapsed_us()
            elif event.name.startswith("aten::"):  # which operators launched them (nested ones too)
                ops[event.name] += 1
    except Exception as e:  # a profiler that fails must not cost the timings of a lent GPU's run
        return {"error": f"{type(e).__name__}: {e}"}
    backends, attention_us = {}, {}
    for name, n in counts.items():
        for backend, marks in ATTENTION_KERNELS.items():
            if any(mark in name.lower() for mark in marks):
                backends.setdefault(backend, {})[name] = n
                attention_us[backend] = attention_us.get(backend, 0.0) + kernel_us[name]
    return {
        "total": sum(counts.values()),
        "distinct": len(counts),
        "attention": backends,
        "top": dict(counts.most_common(10)),
        "aten_ops": dict(ops.most_common(40)),
        "busy_us": busy_us(spans),
        "attention_us": attention_us,
        "top_by_time_us": dict(kernel_us.most_common(10)),
    }
