"""Which machine a benchmark or a run trained on, in words for its JSON and figures. The sessions'
VMs change, and two of them call themselves "AMD EPYC": a Zen 4 with AVX-512 and an AVX2-only one at
about half the speed. So a processor is named by its model, its family and model numbers and its
widest vector unit ("AMD EPYC (family 25 model 17, AVX-512)"), not by the model name alone
(platform.processor() is empty on Linux, and platform.machine() says only x86_64)."""

import os
import platform


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():  # the first processor's block ends
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def generation(fields: dict) -> str:
    """A processor's generation from its /proc/cpuinfo *fields*: family and model numbers, and its
    widest vector unit ("family 25 model 17, AVX-512"); "" when the fields say neither."""
    flags = set(fields.get("flags", "").split())
    vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), None)
    numbers = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None
    return ", ".join(part for part in (numbers, vector) if part)


def cpu_model() -> str:
    """The processor as a run's record names it: the kernel's "model name" with its generation
    (``generation``), else what platform knows of it."""
    fields = _cpuinfo()
    name = fields.get("model name") or platform.processor() or f"{platform.machine()} CPU"
    detail = generation(fields)
    return f"{name} ({detail})" if detail else name


def host() -> str:
    """The processor and its cores, e.g. "AMD EPYC (family 25 model 17, AVX-512), 2 cores"."""
    return f"{cpu_model()}, {os.cpu_count()} cores"
