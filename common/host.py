"""Which machine a benchmark ran on, in words for its JSON and figures. The sessions' VMs change
(AMD EPYC one day, Intel Xeon the next), so the processor's model is named, not its architecture
(platform.processor() is empty on Linux, and platform.machine() says only x86_64)."""

import os
import platform


def cpu_model() -> str:
    """The processor's model as the kernel names it (/proc/cpuinfo's first "model name"), else what
    platform knows of it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or f"{platform.machine()} CPU"


def host() -> str:
    """The processor and its cores, e.g. "AMD EPYC, 2 cores"."""
    return f"{cpu_model()}, {os.cpu_count()} cores"
