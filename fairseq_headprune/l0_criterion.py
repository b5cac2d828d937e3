"""``label_smoothed_cross_entropy_l0``: cross-entropy plus the L0 penalty on head gates.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019, section 6) fine-tune with

    L = L_xent + λ · L_C,   L_C = Σ_h P(g_h ≠ 0)

(Louizos et al. 2018's expected L0 norm of the Hard Concrete gates).

Weighting. fairseq sums the loss over tokens and divides gradients by the summed
``sample_size`` of all workers and micro-batches, so the token-mean cross-entropy is what
the optimiser sees. The penalty is therefore added as ``λ · L_C · sample_size``: its
gradient is λ·∂L_C whatever the batch size, ``--update-freq`` or number of workers.

Normalisation (``--l0-penalty-normalization``):

- ``sum`` (default): L_C = Σ over all gated heads of P(open);
- ``layer-mean``: Voita's code, L_C = mean over gated attention layers of the per-layer sum.
  A λ published for Voita's code is used as is with this choice; it equals ``sum`` with
  λ_sum = λ_voita / (number of gated attention layers).

The logged ``loss`` includes the penalty; select checkpoints with
``--best-checkpoint-metric nll_loss`` (or BLEU), never ``loss``.
"""

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from torch import nn

from fairseq_headprune.gated_transformer import SITES, gates_by_name, site_of

NORMALIZATIONS = ChoiceEnum(["sum", "layer-mean"])
# Logged per attention type: expected open heads Σ P(open), and open deterministic gates.
STAT_PREFIXES = ("exp_open", "open")


def _metric(prefix: str, site: str) -> str:
    return f"{prefix}_{site.replace('-', '_')}"


def gate_statistics(model: nn.Module) -> "dict[str, dict[str, torch.Tensor]]":
    """Per attention type: stacked P(open) and deterministic gates of every gated layer."""
    stats: dict[str, dict[str, list]] = defaultdict(lambda: {"prob_open": [], "gate": []})
    for name, gate in gates_by_name(model):
        stats[site_of(name)]["prob_open"].append(gate.prob_open())
        stats[site_of(name)]["gate"].append(gate.deterministic())
    return {
        site: {k: torch.stack(v) for k, v in stats[site].items()}  # (layers, heads)
        for site in SITES
        if site in stats
    }


def l0_penalty(model: nn.Module, normalization: str = "sum") -> torch.Tensor:
    """L_C of the model's gates (differentiable); 0 for a model without gates."""
    per_layer = [gate.prob_open().sum() for _, gate in gates_by_name(model)]
    if not per_layer:
        return torch.zeros(())
    total = torch.stack(per_layer).sum()
    return total / len(per_layer) if normalization == "layer-mean" else total


@dataclass
class LabelSmoothedCrossEntropyL0CriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l0_lambda: float = field(
        default=0.0,
        metadata={"help": "weight λ of the L0 penalty on head gates (Voita et al. 2019)"},
    )
    l0_penalty_normalization: NORMALIZATIONS = field(
        default="sum",
        metadata={
            "help": "sum: Σ_h P(open) over all gated heads; layer-mean: mean over gated "
            "layers of the per-layer sum, as in Voita et al.'s code"
        },
    )


@register_criterion(
    "label_smoothed_cross_entropy_l0", dataclass=LabelSmoothedCrossEntropyL0CriterionConfig
)
class LabelSmoothedCrossEntropyL0Criterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy + λ · Σ_h P(g_h ≠ 0)."""

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        l0_lambda=0.0,
        l0_penalty_normalization="sum",
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if l0_lambda < 0:
            raise ValueError(f"--l0-lambda must be >= 0, got {l0_lambda}")
        self.l0_lambda = l0_lambda
        self.l0_penalty_normalization = str(l0_penalty_normalization)

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        penalty = l0_penalty(model, self.l0_penalty_normalization).to(loss)
        # × sample_size: fairseq divides gradients by the summed sample size (see docstring).
        loss = loss + self.l0_lambda * penalty * sample_size
        logging_output["loss"] = loss.data
        logging_output["l0_penalty"] = penalty.item() * sample_size
        with torch.no_grad():
            for site, stats in gate_statistics(model).items():
                expected = stats["prob_open"].sum().item()
                n_open = (stats["gate"] > 0).sum().item()
                logging_output[_metric("exp_open", site)] = expected * sample_size
                logging_output[_metric("open", site)] = n_open * sample_size
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if sample_size == 0:
            return
        keys = ["l0_penalty"] + [_metric(p, s) for p in STAT_PREFIXES for s in SITES]
        for key in keys:
            if any(key in log for log in logging_outputs):
                value = sum(log.get(key, 0) for log in logging_outputs) / sample_size
                metrics.log_scalar(key, value, sample_size, round=3)
