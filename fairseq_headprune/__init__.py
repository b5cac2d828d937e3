"""fairseq-headprune: find, remove and explain the attention heads a Transformer needs.

Implements Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned" (ACL 2019) as a fairseq ``--user-dir`` plugin.
"""

from fairseq_headprune import _quiet  # noqa: F401  first: before anything imports fairseq
from fairseq_headprune.checkpoint_safety import allow_fairseq_checkpoints
from fairseq_headprune.errors import install_excepthook
from fairseq_headprune.registration import register_with_fairseq

# fairseq checkpoints load under torch >= 2.6's weights_only=True default.
allow_fairseq_checkpoints()
# An input error ends a fairseq CLI with one line naming it (HEADPRUNE_TRACEBACK=1: traceback).
install_excepthook()
# The model and criterion (gated_transformer, label_smoothed_cross_entropy_l0): registered with
# fairseq when fairseq is imported, so the tools that need no fairseq start without it.
register_with_fairseq()
