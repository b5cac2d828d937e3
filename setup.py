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
    # Compatible ranges; the exact versions the tests run with are in constraints.txt.
    # fairseq itself is not listed: one of fairseq 0.12.x (Python <= 3.10) or its fork
    # fairseq-fixed 0.12.x (imports on Python 3.11) must be installed, which pip cannot express
    # as a requirement; the extras below pick one. Both sdists build against the torch already
    # installed (scripts/setup.sh: pip install --no-build-isolation).
    install_requires=[
        "torch>=2.1",
        "sacrebleu>=2.0,<3",
        "sentencepiece>=0.1.99",
        "numpy>=1.24",
    ],
    extras_require={
        "fairseq": ["fairseq>=0.12,<0.13"],
        "fairseq-fixed": ["fairseq-fixed>=0.12,<0.13"],
        # `fairseq-headprune score` (heatmaps, --parse stanza) and the study's plots
        "analysis": ["matplotlib>=3.6", "stanza>=1.5"],
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "ruff>=0.17"],
    },
    entry_points={"console_scripts": ["fairseq-headprune = fairseq_headprune.cli:main"]},
)
