#!/usr/bin/env python3
"""Run fairseq's own test files without and with the plugin loaded, and compare them test by test.

Loaded (``--user-dir`` imports it), the plugin changes fairseq for the whole process; it is meant
to change nothing for fairseq's own models. fairseq's test suite, which we did not write, is the
check: run it four ways and see which tests the plugin turns from passing to failing.

    python scripts/fairseq_tests_with_plugin.py /path/to/fairseq-checkout            # 15 files
    python scripts/fairseq_tests_with_plugin.py /path/to/fairseq-checkout tests/test_train.py

The checkout needs fairseq's ``tests/`` and ``scripts/`` (its tests import both); the fairseq
that runs is the installed one. The four columns:

- ``fairseq``: fairseq alone. Under torch >= 2.6 its checkpoint tests fail on ``weights_only``;
- ``fairseq, weights_only off``: fairseq alone with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which
  shows what those tests do once they can unpickle;
- ``plugin``: ``import fairseq_realformer`` first, as ``--user-dir`` does;
- ``plugin, fixes off``: the same with ``REALFORMER_FAIRSEQ_FIXES=0``: what the model needs from
  fairseq (``patches.model_support``) without the plugin's fixes of fairseq's defects (``patches.fixes``).

Prints one row per file (passed/failed/skipped) and every test whose result differs between the
columns; the pytest output and JUnit XML of each column go to --out.
"""

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from user_error import UserError  # scripts/user_error.py

PROG = "fairseq_tests_with_plugin.py"
# checkpoints, training, generation, data, EMA and the Transformer
FILES = [
    "tests/test_checkpoint_utils.py",
    "tests/test_checkpoint_utils_for_task_level_attributes.py",
    "tests/test_train.py",
    "tests/test_average_checkpoints.py",
    "tests/test_ema.py",
    "tests/test_sequence_generator.py",
    "tests/test_sequence_scorer.py",
    "tests/test_transformer.py",
    "tests/test_multihead_attention.py",
    "tests/test_iterators.py",
    "tests/test_data_utils.py",
    "tests/test_dataset.py",
    "tests/test_dictionary.py",
    "tests/test_label_smoothing.py",
    "tests/test_reproducibility.py",
]
WITH_PLUGIN = "import sys, pytest, fairseq_realformer; sys.exit(pytest.main(sys.argv[1:]))"
COLUMNS = {  # name: (python -c code or None for -m pytest, extra environment)
    "fairseq": (None, {}),
    "fairseq, weights_only off": (None, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}),
    "plugin": (WITH_PLUGIN, {}),
    "plugin, fixes off": (WITH_PLUGIN, {"REALFORMER_FAIRSEQ_FIXES": "0"}),
}
# what a caller's environment may set that would blur the columns: each column sets its own
OVERRIDES = ("TORCH_FORCE", "REALFORMER_FAIRSEQ_FIXES")


def run_column(name, checkout, files, out):
    """Run pytest on *files* in *checkout* as column *name*; return {(file, test): outcome}."""
    code, env = COLUMNS[name]
    slug = name.replace(", ", "-").replace(" ", "-")
    xml, log_path = out / f"{slug}.xml", out / f"{slug}.log"
    entry = ["-c", code] if code else ["-m", "pytest"]
    command = [sys.executable, *entry, "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={xml}", *files]
    print(f"[fairseq-tests] {name}: pytest {' '.join(files)} (output in {log_path})", flush=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(OVERRIDES)}
    with open(log_path, "w") as log:
        subprocess.run(
            command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT, env={**base, "OMP_NUM_THREADS": "1", **env}
        )
    if not xml.exists():
        raise UserError(f"pytest wrote no results for column {name!r}: see {log_path}")
    return outcomes(xml)


def outcomes(xml):
    """{(test file, [class::]test): 'passed' | 'failed' | 'skipped'} of a JUnit XML file."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        # pytest's classname: the file's dotted path (tests.test_x), then the class if any
        parts = case.get("classname", "").split(".")
        at = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        module, test = parts[at], "::".join(parts[at + 1 :] + [case.get("name")])
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        found[(module + ".py", test)] = outcome
    return found


def table(results):
    """Markdown: one row per test file, passed/failed/skipped in each column."""
    names = list(results)
    lines = ["| test file | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for module in sorted({key[0] for column in results.values() for key in column}):
        cells = []
        for name in names:
            counts = Counter(v for key, v in results[name].items() if key[0] == module)
            cells.append(f"{counts['passed']}/{counts['failed']}/{counts['skipped']}")
        lines.append(f"| {module} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def differences(results):
    """Lines naming each test whose outcome is not the same in every column."""
    names = list(results)
    keys = sorted({key for column in results.values() for key in column})
    return [
        f"{module} {test}: " + ", ".join(f"{name} {results[name].get((module, test), 'absent')}" for name in names)
        for module, test in keys
        if len({results[name].get((module, test)) for name in names}) > 1
    ]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a fairseq source checkout (its tests/ and scripts/)")
    parser.add_argument("files", nargs="*", default=FILES, help="test files, relative to the checkout (default: 15)")
    parser.add_argument("--out", type=Path, default=Path("runs/fairseq-tests"), help="logs and JUnit XML")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not (args.checkout / "tests").is_dir():
        raise UserError(f"{args.checkout}: no tests/ folder; give a fairseq source checkout")
    missing = [f for f in args.files if not (args.checkout / f).is_file()]
    if missing:
        raise UserError(f"{args.checkout}: no {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: run_column(name, args.checkout.resolve(), args.files, args.out.resolve()) for name in COLUMNS}
    print("\npassed/failed/skipped\n" + table(results))
    changed = differences(results)
    print(
        "\ntests whose result differs:" + "".join(f"\n- {line}" for line in changed)
        if changed
        else "\nevery test: the same in every column"
    )


if __name__ == "__main__":
    try:
        main()
    except UserError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(2)
