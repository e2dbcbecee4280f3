"""Mistakes a user fixes by changing a flag or a file end the process with one line, and take
back the save dir fairseq-train made for the run while it is still empty."""

import argparse
import functools
import sys
from typing import Optional

from ...errors import RealformerConfigError, prog
from ...files import folders
from ...optim import precision

# The folders fairseq-train made for its save dir in this process, outermost first.
_new_save_dirs: list = []


def remember_new_save_dir(verify_checkpoint_directory):
    """fairseq-train makes its save dir before it builds the model and loads the data, so a run
    that the plugin refuses after that point (a missing --restore-file, half precision without a
    GPU, a damaged checkpoint) would leave an empty save dir behind. Remember the folders made
    here; ``one_line_errors`` removes those still empty when such an error ends the process.
    Plugin flags are checked before (``options.check``, while parsing): no folder at all. (No
    fairseq issue: the refusals are the plugin's.)

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.verify_checkpoint_directory(
    cfg.checkpoint.save_dir)`` on the master process, which makes the folder.

    A stock ``transformer`` run: the same folders are made; only a run that ends with one of the
    plugin's one-line errors takes back those still empty."""

    @functools.wraps(verify_checkpoint_directory)
    def verify_remembering_new_folders(save_dir, *args, **kwargs):
        _new_save_dirs.extend(folders.missing(save_dir))
        return verify_checkpoint_directory(save_dir, *args, **kwargs)

    return verify_remembering_new_folders


def one_line_errors(previous_hook):
    """fairseq's CLIs let exceptions from model construction escape as deep tracebacks; for
    mistakes the user fixes by changing a flag or a file (``RealformerConfigError``), the
    message is all that helps: ``fairseq-train: error: ...``, and a save dir fairseq-train made
    for the run is taken back while still empty. Every other exception goes to the previous hook
    unchanged. (No fairseq issue: the errors are the plugin's, and fairseq's --fp16 with --bf16.)

    Call site: the interpreter calls ``sys.excepthook`` with the exception that ends the process.

    A stock ``transformer`` run: only the plugin's own errors (``RealformerConfigError``: the
    fixes of ``fixes``, e.g. a missing --restore-file), and fairseq's refusal of --fp16
    with --bf16, are shortened; fairseq's other exceptions print their tracebacks as before."""

    def print_config_errors_as_one_line(exc_type, exc, tb):
        message = str(exc) if issubclass(exc_type, RealformerConfigError) else _bf16_with_fp16(exc)
        if message is not None:
            print(f"{prog()}: error: {message}", file=sys.stderr)
            folders.remove_empty(_new_save_dirs)
            return
        previous_hook(exc_type, exc, tb)

    return print_config_errors_as_one_line


def _bf16_with_fp16(exc) -> Optional[str]:
    """The one-line form of fairseq's parser refusing --fp16 with --bf16 (a ``ValueError`` about
    --tpu, which --bf16 turns on and the user never typed), or None for any other exception."""
    asked = {"--bf16", "--memory-efficient-bf16"} & set(sys.argv[1:])
    if type(exc) is ValueError and str(exc) == "Cannot combine --fp16 and --tpu, use --bf16 on TPUs" and asked:
        if not precision.xla_installed():
            efficient = "--memory-efficient-bf16" in asked
            return precision.problem(argparse.Namespace(bf16=True, fp16=True, memory_efficient_bf16=efficient))
    return None
