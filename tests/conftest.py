"""The order the suite runs in, and the background jobs of the test modules that will run
(tests/background.py).

- In one process (``-n 0``): the modules with background jobs run last and their jobs start as
  soon as the tests are collected, so that the rest of the suite runs while they do.
- Under pytest-xdist (scripts/test.sh: ``-n 2 --dist loadfile --no-loadscope-reorder``): a module
  is one worker's unit of work and the longest go first (``RUN_SECONDS``, a module's own estimate),
  so that the short ones fill in beside them instead of one long module running alone at the end.
  Every worker collects every module, so a job starts only when one of its tests asks for it.

And what PyTorch reports of the CPU: REALFORMER_TEST_BF16_UNITS=none (or native) runs the whole
suite, and the commands it starts, as on a CPU without (with) bfloat16 units (tests/cpu_report).
"""

import pytest

from . import cpu_report


def pytest_configure(config):
    units = cpu_report.forced()
    if units is not None:
        try:
            cpu_report.check(units)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        import torch

        cpu_report.force(torch.cpu, units)


def _module(item):
    return getattr(item, "module", None)


def _jobs(items):
    modules = {_module(item) for item in items if _module(item) is not None}
    return [job for module in modules for job in getattr(module, "BACKGROUND", ())]


def _under_xdist(config):
    return hasattr(config, "workerinput")


def pytest_collection_modifyitems(session, config, items):
    # stable sorts: each group keeps pytest's order
    if _under_xdist(config):
        items.sort(key=lambda item: -getattr(_module(item), "RUN_SECONDS", 0))
    else:
        items.sort(key=lambda item: bool(getattr(_module(item), "BACKGROUND", ())))


def pytest_collection_finish(session):
    if _under_xdist(session.config):
        return
    for job in _jobs(session.items):
        job.start()


def pytest_sessionfinish(session):
    for job in _jobs(getattr(session, "items", [])):
        job.stop()
