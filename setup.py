"""fairseq-realformer: RealFormer residual attention and ADMIN deep Transformers for fairseq."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="fairseq-realformer",
    version="0.1.0",
    description="RealFormer (residual attention) and ADMIN-style deep Transformers for NMT, "
    "as a fairseq --user-dir plugin",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["fairseq_realformer", "fairseq_realformer.*"]),
    # fairseq itself is deliberately not a hard requirement: a user who has fairseq from
    # source must not get a second distribution writing the same `fairseq` package.
    # `pip install .[fairseq]` (or requirements.txt) brings the tested one, ve-fairseq.
    install_requires=[
        "sacrebleu>=2.0",
        "sentencepiece>=0.1.97",
        "sacremoses>=0.0.53",
        "subword-nmt>=0.3.8",
        # realformer-analyze: figures, progress bar
        "matplotlib>=3.7",
        "tqdm>=4",
    ],
    extras_require={
        "fairseq": ["ve-fairseq==0.12.3", "torchaudio==2.11.0"],
        # the reference implementations tests/test_hyper_connections_vs_references.py compares with
        "test": [
            "pytest>=7",
            "pytest-xdist>=3.6",
            "ruff==0.17.6",
            "scipy",
            "hyper-connections==0.4.11",
            "x-transformers==2.12.2",
        ],
    },
    entry_points={
        "console_scripts": [
            "realformer-user-dir = fairseq_realformer.user_dir:main",
            "realformer-analyze = fairseq_realformer.analysis.cli:main",
        ],
    },
)
