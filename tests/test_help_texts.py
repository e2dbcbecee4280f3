"""The commands a script's --help shows can be pasted as they read. A script's help is its module
docstring; in a docstring that is not raw, a line ending in a single backslash joins the next line
to it, so a command written over two lines prints as one with a gap of spaces in it."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("benchmarks", "studies", "common", "scripts", "examples", "fairseq_realformer")
JOINED_LINE = re.compile(r"(?<!\\)(?:\\\\)*\\\n")  # an odd number of backslashes, then a newline


def joined_lines(source):
    """Line numbers in the module docstring of `source` that a backslash joins to the next."""
    tree = ast.parse(source)
    if ast.get_docstring(tree, clean=False) is None:
        return []
    first = tree.body[0]
    text = ast.get_source_segment(source, first)
    if re.match(r"[a-zA-Z]*[rR]", text):  # a raw string keeps its backslashes
        return []
    opening = len(text) - len(text.lstrip("bBuUfF")) + 3
    return [
        first.lineno + text.count("\n", 0, match.start())
        for match in JOINED_LINE.finditer(text)
        if match.start() != opening  # '"""\' on the first line is meant: no empty first line
    ]


def test_a_backslash_at_a_line_end_is_found():
    assert joined_lines('"""Run:\n\n    python x.py --a \\\n        --b\n"""\n') == [3]
    assert joined_lines('"""Run:\n\n    python x.py --a \\\\\n        --b\n"""\n') == []
    assert joined_lines('r"""Run:\n\n    python x.py --a \\\n        --b\n"""\n') == []
    assert joined_lines('"""\\\nRun: python x.py\n"""\n') == []


def test_no_help_text_joins_its_command_lines():
    joined = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        for line in joined_lines(path.read_text(encoding="utf-8"))
    ]
    assert not joined, f"end these docstring lines with two backslashes (or make it raw): {', '.join(joined)}"
