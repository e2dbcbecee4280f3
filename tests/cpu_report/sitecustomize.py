"""PyTorch's report of the CPU's bfloat16 units, forced in the Python processes a test starts.

Python runs this file at start-up when its folder is on PYTHONPATH, which the tests put there
(``tests.cpu_report.environment``) for the commands they start, with REALFORMER_TEST_BF16_UNITS:

- ``none``: neither AVX512-BF16 nor AMX, as a CPU that emulates bfloat16 reports;
- ``native``: AVX512-BF16.

Only what ``torch.cpu`` reports changes, as soon as torch is imported; the kernels PyTorch runs
stay this machine's. Test-only: the plugin reads PyTorch's report
(``fairseq_realformer.optim.precision.native_on_cpu``) and knows nothing of this.
"""

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "REALFORMER_TEST_BF16_UNITS"
REPORTS = {
    "none": {"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False},
    "native": {"_is_avx512_bf16_supported": True},
}


def check(units: str) -> None:
    if units not in REPORTS:
        raise ValueError(f"{ENV}={units}: expected one of {', '.join(REPORTS)}")


def force(cpu, units: str) -> None:
    """Make the module *cpu* (``torch.cpu``) report *units* (a key of REPORTS)."""
    check(units)
    for name, value in REPORTS[units].items():
        setattr(cpu, name, lambda value=value: value)


class _ForcedOnImport(importlib.abc.MetaPathFinder):
    """Forces the report once ``torch.cpu`` is imported (``import torch`` imports it); a process
    that never imports torch is left alone."""

    def __init__(self, units: str):
        self.units = units

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                force(module, self.units)

            spec.loader.exec_module = exec_module
        return spec


if __name__ == "sitecustomize" and os.environ.get(ENV):
    sys.meta_path.insert(0, _ForcedOnImport(os.environ[ENV]))
