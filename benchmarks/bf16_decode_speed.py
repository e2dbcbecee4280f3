"""bf16 against float32 for beam decoding alone, in one process, without data or training: what
``bf16_speed.py --decode-only`` runs (its flags, its help), under the name this command had.

    python benchmarks/bf16_decode_speed.py --threads 1 --repeats 21 --gen-sentences 64 \\
        --models small-transformer,small-realformer
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import sys

from benchmarks import bf16_speed

if __name__ == "__main__":  # the JSON's command names bf16_speed.py --decode-only, which it ran
    bf16_speed.main([*sys.argv[1:], "--decode-only"])
