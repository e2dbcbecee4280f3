"""Starts the background jobs of the test modules that will run (tests/background.py), and runs
those modules last, so that the rest of the suite runs while their jobs do."""


def _jobs(items):
    modules = {item.module for item in items if getattr(item, "module", None) is not None}
    return [job for module in modules for job in getattr(module, "BACKGROUND", ())]


def pytest_collection_modifyitems(session, config, items):
    # stable: each group keeps pytest's order
    items.sort(key=lambda item: bool(getattr(getattr(item, "module", None), "BACKGROUND", ())))


def pytest_collection_finish(session):
    for job in _jobs(session.items):
        job.start()


def pytest_sessionfinish(session):
    for job in _jobs(getattr(session, "items", [])):
        job.stop()
