"""fairseq-train's log, read in one place for the benchmarks and the tests: its interval lines
(``train_inner``), its end-of-epoch training (``train``) and validation (``valid``) lines, in either
``--log-format`` (simple or json), as a kind and a dict of numbers (``loss``, ``num_updates``,
``wps``, ``epoch``, ...; json's ``train_``/``valid_`` prefixes dropped, NaN and inf kept), and when
a line was logged."""

import datetime
import json
import math
import re

_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|")  # fairseq's log lines start with it
_STATS = re.compile(r"\| (train_inner|train|valid) \| (.*)$")
_EPOCH = re.compile(r"^epoch (\d+)(?::| \|)")  # simple: "epoch 002:  50 / 132 loss=..." or "epoch 002 | loss ..."
_INNER_FIELD = re.compile(r"(\w+)=([^,\s]+)")  # simple train_inner: loss=12.465, nll_loss=12.333, ...
_EPOCH_FIELD = re.compile(r"\| (\w+) ([^\s|]+)")  # simple train/valid: | loss 10.834 | nll_loss 10.49 | ...


def _numbers(pairs):
    fields = {}
    for name, value in pairs:
        try:
            fields[name] = float(value)
        except (TypeError, ValueError):
            continue  # words, e.g. simple valid lines' "valid on 'valid' subset"
    return fields


def parse(line):
    """(kind, fields) of one log line, or None for a line that is not one of fairseq's stats lines."""
    match = _STATS.search(line)
    if match is None:
        return None
    kind, rest = match.groups()
    if rest.startswith("{"):
        try:
            raw = json.loads(rest)
        except ValueError:
            return None
        prefix = f"{kind}_"
        fields = _numbers(
            (name[len(prefix) :] if name.startswith(prefix) else name, value) for name, value in raw.items()
        )
    else:
        epoch = _EPOCH.match(rest)
        if epoch is None:
            return None
        fields = _numbers(
            (_INNER_FIELD if kind == "train_inner" else _EPOCH_FIELD).findall(
                rest if kind == "train_inner" else f"| {rest}"
            )
        )
        fields["epoch"] = int(epoch.group(1))
    if "epoch" in fields and math.isfinite(fields["epoch"]):
        fields["epoch"] = int(fields["epoch"])
    return kind, fields


def records(lines, *kinds):
    """Every stats line of *lines* as (kind, fields), in order; only those of *kinds* if given."""
    for line in lines:
        parsed = parse(line)
        if parsed is not None and (not kinds or parsed[0] in kinds):
            yield parsed


def timestamp(line):
    """When fairseq logged *line* (the local time its lines start with), or None for another line."""
    match = _TIMESTAMP.match(line)
    return datetime.datetime.fromisoformat(match.group(1)) if match else None
