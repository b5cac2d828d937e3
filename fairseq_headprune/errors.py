"""Errors a user can act on, shared by the plugin's fairseq components and its CLI.

Part of fairseq-headprune (Voita et al. 2019, "Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"): a wrong flag, file or value
is reported as one line that names it, what was given and what is allowed.
"""

from __future__ import annotations


class HeadpruneError(ValueError):
    """An input error the user can fix (a flag, a file, a value): shown as one line."""
