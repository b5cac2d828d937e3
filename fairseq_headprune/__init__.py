"""fairseq-headprune: find, remove and explain the attention heads a Transformer needs.

Implements Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned" (ACL 2019) as a fairseq ``--user-dir`` plugin.
"""

# Modules that register fairseq components (imported for their side effects).
from fairseq_headprune import (
    _quiet,  # noqa: F401  first: before anything imports fairseq
    gated_transformer,  # noqa: F401  model + arch presets
    l0_criterion,  # noqa: F401  label_smoothed_cross_entropy_l0
)
from fairseq_headprune.checkpoint_safety import allow_fairseq_checkpoints
from fairseq_headprune.errors import install_excepthook

# fairseq checkpoints load under torch >= 2.6's weights_only=True default.
allow_fairseq_checkpoints()
# An input error ends a fairseq CLI with one line naming it (HEADPRUNE_TRACEBACK=1: traceback).
install_excepthook()
