"""Keep fairseq's import-time noise out of ``fairseq-headprune``'s output (Voita et al. 2019
tools; see ``fairseq_headprune.cli``).

fairseq's text-to-speech tasks call ``logging.basicConfig(level=INFO)`` and log a
tensorboardX install hint when fairseq is first imported. Nothing here uses them; the fairseq
CLIs import them before ``--user-dir`` loads this package, so only this package's own
command (and Python users of it) is affected.
"""

import logging

for _name in ("fairseq.tasks.text_to_speech", "fairseq.tasks.frm_text_to_speech"):
    logging.getLogger(_name).setLevel(logging.WARNING)
