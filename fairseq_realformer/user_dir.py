"""Print the directory to pass as ``--user-dir``, wherever the package is installed.

fairseq-train ... --user-dir "$(realformer-user-dir)"
"""

import os


def path() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    print(path())


if __name__ == "__main__":
    main()
