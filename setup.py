"""fairseq-headprune: prune attention heads of fairseq Transformers (Voita et al. 2019)."""

from setuptools import find_packages, setup

setup(
    name="fairseq-headprune",
    version="0.1.0",
    description=(
        "Hard Concrete head gates, L0 pruning, head analysis and physical head removal "
        "for fairseq Transformers (Voita et al. 2019)"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    package_data={"fairseq_headprune.scoring": ["heads.schema.json"]},
    install_requires=[
        # CPU wheel here; scripts/setup.sh installs it first so nothing pulls a CUDA build.
        "torch==2.13.0",
        # fairseq 0.12 fork that imports on Python 3.11 (the official 0.12.2 does not).
        "fairseq-fixed==0.12.3.1",
        "sacrebleu>=2.4,<3",
        "sentencepiece>=0.2",
        "stanza>=1.9",
        "matplotlib>=3.8",
        "numpy>=1.26",
    ],
    extras_require={"dev": ["pytest>=8", "pytest-xdist>=3.5", "ruff==0.17.6"]},
    entry_points={"console_scripts": ["fairseq-headprune = fairseq_headprune.cli:main"]},
)
