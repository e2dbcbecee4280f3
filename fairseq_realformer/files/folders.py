"""Folders a command makes for its output, taken back when it fails before writing into them: a
refused command leaves no empty folder behind."""

import os
from typing import List


def missing(path: str) -> List[str]:
    """The folders that making *path* would create: *path* and its missing parents, outermost first."""
    created = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        created.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return created[::-1]


def make(path: str) -> List[str]:
    """Make *path* (and its parents); return the folders this created, outermost first."""
    created = missing(path)
    os.makedirs(path, exist_ok=True)
    return created


def remove_empty(created: List[str]) -> None:
    """Remove the folders of *created* (outermost first, as ``make`` returns them) that are still
    empty, innermost first; a folder that holds anything stays, and so do its parents."""
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            continue
        except OSError:  # not empty: it and its parents stay
            return
