"""Keep fairseq's configuration noise out of the output (Voita et al. 2019 tools; see
``fairseq_headprune.cli``).

fairseq's text-to-speech tasks call ``logging.basicConfig(level=INFO)`` and log a
tensorboardX install hint when fairseq is first imported. Nothing here uses them; the fairseq
CLIs import them before ``--user-dir`` loads this package, so only this package's own
command (and Python users of it) is affected.

fairseq 0.12 composes its configuration with a newer Hydra than it was written for, which
warns about deprecated APIs on every run of ``fairseq-train``/``-generate``/``-validate``/
``-interactive`` after ``--user-dir`` has loaded this package. Several of those multi-line
warnings have lines starting with ``T`` ("The version_base parameter …", "This behavior …",
"The strict flag …"): captured with ``2>&1``, ``grep ^T`` takes them for reference
sentences and ``fairseq-score`` reports a wrong BLEU with exit code 0. They are silenced
here; read translations from ``fairseq-generate``'s stdout only all the same (README, "When
something goes wrong").
"""

import logging
import warnings

for _name in ("fairseq.tasks.text_to_speech", "fairseq.tasks.frm_text_to_speech"):
    logging.getLogger(_name).setLevel(logging.WARNING)

# The start of each Hydra deprecation warning fairseq 0.12 triggers (regular expressions).
HYDRA_WARNINGS = (
    r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In 'config': Usage of deprecated keyword in package header",
    r"\s*'config' is validated against ConfigStore schema",
    r"\s*The strict flag in the compose API is deprecated",
)
for _message in HYDRA_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=UserWarning)
