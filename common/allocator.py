"""glibc's allocator settings for a training on a CPU, fixed here once: the study's runner (through
examples/multi30k/run.sh), the depth-stability study and the training benchmarks start fairseq-train
with them.

Why: a training's vocabulary-sized tensors (~130 MB at 4,096 tokens × 8k pieces) lie above glibc's
mmap threshold, so every update maps them again and the kernel zero-fills every page. With the three
settings below the heap keeps them: the study's 18+18 model trains ~1.35x faster on a 2-core Zen 4
with the same losses (issue 100; benchmarks/allocator_speed.py measures it). The trap: any one of them set
alone turns off glibc's dynamic mmap threshold, and the trim threshold alone halves the speed. So
they are set together or not at all; a setting the user has already made is left as it is.

Opt out with REALFORMER_MALLOC=off (glibc's defaults, or whatever the user set).

    python common/allocator.py    # the settings a training gets here, one NAME=VALUE a line
"""

import os

SETTINGS = {
    "MALLOC_MMAP_MAX_": "0",  # never mmap: freed blocks stay in the heap for the next update
    "MALLOC_TRIM_THRESHOLD_": "100000000000",  # never hand the heap's top back to the kernel
    "MALLOC_TOP_PAD_": "1073741824",  # grow the heap 1 GiB at a time
}
OPT_OUT = "REALFORMER_MALLOC"  # =off: add none of them


def settings(env=None) -> dict:
    """The settings a training started with environment *env* (default: this process's) gets:
    all three, each as the user set it or as SETTINGS has it; none when *env* opts out."""
    env = os.environ if env is None else env
    if env.get(OPT_OUT, "").lower() in ("off", "0", "no", "none"):
        return {}
    return {name: env.get(name, value) for name, value in SETTINGS.items()}


def environment(env=None, cpu=None) -> dict:
    """*env* (default: this process's) with the settings of a training added: ``for_training``'s,
    or with *cpu* True (a training given --cpu) ``settings``'."""
    env = dict(os.environ if env is None else env)
    return {**env, **(settings(env) if cpu else for_training(env))}


def for_training(env=None) -> dict:
    """The settings a fairseq-train started here gets: ``settings(env)`` where it trains on the
    CPU, none where it trains on a GPU (fairseq-train takes the GPU whenever there is one)."""
    import torch

    return {} if torch.cuda.is_available() else settings(env)


def main():
    """Print the settings to export for a training here, one NAME=VALUE a line (run.sh)."""
    for name, value in for_training().items():
        print(f"{name}={value}")


if __name__ == "__main__":
    main()
