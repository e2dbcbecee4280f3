"""Starts the background jobs of the test modules that will run (tests/background.py)."""


def _jobs(items):
    modules = {item.module for item in items if getattr(item, "module", None) is not None}
    return [job for module in modules for job in getattr(module, "BACKGROUND", ())]


def pytest_collection_finish(session):
    for job in _jobs(session.items):
        job.start()


def pytest_sessionfinish(session):
    for job in _jobs(getattr(session, "items", [])):
        job.stop()
