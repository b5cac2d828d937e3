"""Give a checkpoint saved with --no-save-optimizer-state a fresh (empty) Adam state, so that
fairseq-train resumes it with its update count and learning-rate schedule (Adam's moments
start again from zero, bias-corrected). Session 7 (continuing the H200 baseline on the CPU).

    python add_fresh_adam.py SRC.pt DST.pt DATA_BIN
"""

import sys

import torch
from fairseq import checkpoint_utils
from fairseq.optim.adam import Adam

import fairseq_headprune  # noqa: F401  safe checkpoint loading

src, dst = sys.argv[1], sys.argv[2]
state = torch.load(src, map_location="cpu", weights_only=False)
assert state.get("last_optimizer_state") is None
models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
    [src], arg_overrides={"data": sys.argv[3]}
)
params = [p for p in models[0].parameters() if p.requires_grad]
opt = Adam(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4)
state["last_optimizer_state"] = opt.state_dict()
print(
    "params",
    len(params),
    "num_updates",
    state["optimizer_history"][-1]["num_updates"],
    "iterator",
    state["extra_state"]["train_iterator"],
)
torch.save(state, dst)
