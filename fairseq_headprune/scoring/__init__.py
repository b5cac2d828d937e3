"""Head scorers (Voita et al. 2019; Michel et al. 2019): one interface, one file per family.

See docs/scoring.md and ``base.py``; ``command.py`` is ``fairseq-headprune score``.
"""
