"""``python -m fairseq_realformer.analysis``: the same as ``realformer-analyze``."""

from .cli import main

main()
