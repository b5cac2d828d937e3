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

Exact head budget (``--target-heads K`` or ``TYPE:K,...``): instead of a fixed λ, the
Lagrangian term of Wang et al. 2020 and CoFi drives the expected number of open heads to a
target that ramps to K over ``--target-heads-warmup-updates`` (read from ``model.num_updates``,
which ``GatedTransformerModel.set_num_updates`` stores; ``budget`` explains the rounding term
that leaves exactly K deterministic gates open, docs/target_heads.md the flags). It is added as
``L_budget · sample_size`` like the penalty; its multipliers λ₁, λ₂ are ``nn.Parameter`` s of
this criterion, so fairseq's single optimiser trains them (ascending, ``budget.gradient_ascent``)
and checkpoints keep them (``criterion`` entry). ``--target-heads`` replaces ``--l0-lambda``
(both non-zero is an error).

The logged ``loss`` includes the penalty and the budget term; select checkpoints with
``--best-checkpoint-metric nll_loss`` (or BLEU), never ``loss``. With a budget, every
interval also logs per budget ``c`` (``enc_self``, ``dec_self``, ``dec_enc`` or ``total``):
``target_c`` (the ramped target t), ``exp_open_c`` (ŝ), ``lambda_1_c`` and ``lambda_2_c``.

Gate trajectories (``--gate-trajectory-interval N``): every N updates, the training forward
pass appends every head's P(open) and deterministic gate to ``SAVE_DIR/gate_trajectory.jsonl``
(the format and its reader: ``gate_trajectory``).
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask
from omegaconf import II
from torch import nn

from fairseq_headprune import budget
from fairseq_headprune.errors import HeadpruneError, check_value
from fairseq_headprune.gate_trajectory import TrajectoryWriter, stack_by_site
from fairseq_headprune.gated_attention import gates_by_name
from fairseq_headprune.gated_transformer import GATED_HEADS_ATTR, num_updates_of
from fairseq_headprune.hard_concrete import HardConcreteGate
from fairseq_headprune.sites import SITES

logger = logging.getLogger(__name__)

NORMALIZATIONS = ChoiceEnum(["sum", "layer-mean"])
# Logged per attention type: expected open heads Σ P(open), and open deterministic gates.
STAT_PREFIXES = ("exp_open", "open")
# Logged per budget (attention type or total) with --target-heads.
BUDGET_PREFIXES = ("target", "exp_open", "lambda_1", "lambda_2")


def _metric(prefix: str, site: str) -> str:
    return f"{prefix}_{site.replace('-', '_')}"


def prob_open_by_site(model: nn.Module) -> "dict[str, torch.Tensor]":
    """Per attention type: P(open) of every gated head, (layers, heads), differentiable."""
    return stack_by_site(dict(gates_by_name(model)), HardConcreteGate.prob_open)


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
    # Optional[...]: fairseq's dataclass → argparse conversion does not read `str | None`.
    target_heads: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={
            "help": "exact head budget instead of --l0-lambda: K (open heads in total over all "
            "gated heads) or TYPE:K,... per attention type (e.g. enc-self:10,dec-enc:20). "
            "A Lagrangian term with multipliers trained by gradient ascent drives the "
            "expected number of open heads to K (Wang et al. 2020, CoFi)"
        },
    )
    target_heads_warmup_updates: int = field(
        default=0,
        metadata={
            "help": "ramp the --target-heads target linearly from the number of gated heads "
            "to K over this many updates (0: K from the first update)"
        },
    )
    target_heads_lr_scale: float = field(
        default=10.0,
        metadata={
            "help": "the Lagrange multipliers of --target-heads move this many times faster "
            "than the weights under Adam (multiplier = scale × its parameter)"
        },
    )
    gate_trajectory_interval: int = field(
        default=0,
        metadata={
            "help": "every N updates, append each head's P(open) and deterministic gate to "
            "SAVE_DIR/gate_trajectory.jsonl, a record of when each gate closed "
            "(python -m recipes.study.gate_trajectory reads it; 0: off)"
        },
    )
    save_dir: str = II("checkpoint.save_dir")
    target_heads_rounding: float = field(
        default=2.0,
        metadata={
            "help": "after the --target-heads warm-up, weight μ of a term that opens the K "
            "heads of highest P(open) further and closes the others, so that the "
            "deterministic gates keep exactly K heads (0: off, ŝ = K in expectation only)"
        },
    )


@register_criterion(
    "label_smoothed_cross_entropy_l0", dataclass=LabelSmoothedCrossEntropyL0CriterionConfig
)
class LabelSmoothedCrossEntropyL0Criterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy + λ · Σ_h P(g_h ≠ 0), or + an exact head budget."""

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        l0_lambda=0.0,
        l0_penalty_normalization="sum",
        target_heads=None,
        target_heads_warmup_updates=0,
        target_heads_lr_scale=10.0,
        target_heads_rounding=2.0,
        gate_trajectory_interval=0,
        save_dir=None,
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        check_value("--l0-lambda", l0_lambda, l0_lambda >= 0, "a number >= 0")
        self.l0_lambda = l0_lambda
        self.l0_penalty_normalization = str(l0_penalty_normalization)
        self.targets: dict[str, int] = {}
        if target_heads is not None and str(target_heads).strip().lower() not in ("", "none"):
            self._init_budget(
                target_heads,
                target_heads_warmup_updates,
                target_heads_lr_scale,
                target_heads_rounding,
            )
        # fairseq-train builds the model before the criterion, and a gated_transformer records
        # its gated heads on the task: check them before any step (crash.pt comes after one)
        gated = getattr(task, GATED_HEADS_ATTR, None)
        if gated is None and isinstance(task, FairseqTask):
            gated = {}  # the task built a model that is no gated_transformer
        if gated is not None and not gated and (self.targets or self.l0_lambda > 0):
            flag = "--target-heads" if self.targets else "--l0-lambda"
            raise HeadpruneError(
                f"{flag}: the model has no head gates to prune; train --arch gated_transformer "
                "(or a gated preset) with --head-gates naming the attention types to prune"
            )
        if gated is not None and self.targets:
            budget.check_targets(self.targets, gated)
            self._checked = True
        self.trajectory = TrajectoryWriter(gate_trajectory_interval, save_dir)

    def _init_budget(self, spec: str, warmup_updates: int, lr_scale: float, rounding: float):
        if self.l0_lambda != 0:
            raise HeadpruneError(
                f"--target-heads {spec} and --l0-lambda {self.l0_lambda} both set: the budget's "
                "multipliers replace λ; drop --l0-lambda (or set it to 0)"
            )
        if warmup_updates < 0:
            raise HeadpruneError(
                f"--target-heads-warmup-updates {warmup_updates}: must be a whole number >= 0"
            )
        check_value("--target-heads-lr-scale", lr_scale, lr_scale > 0, "a number > 0")
        check_value("--target-heads-rounding", rounding, rounding >= 0, "a number >= 0")
        self.targets = budget.parse_target_heads(spec, SITES)
        self.target_heads_warmup_updates = int(warmup_updates)
        self.target_heads_lr_scale = float(lr_scale)
        self.target_heads_rounding = float(rounding)
        if self.target_heads_rounding and self.target_heads_warmup_updates == 0:
            logger.warning(
                "--target-heads-rounding with --target-heads-warmup-updates 0 commits to the "
                "top-K heads from the first update, when all gates are still alike; "
                "give a warm-up so that the ranking means something"
            )
        n = len(self.targets)
        # One multiplier pair per budget; the multiplier is lr_scale × the parameter.
        self.lambda_1 = nn.Parameter(torch.zeros(n))  # (C,)
        self.lambda_2 = nn.Parameter(torch.zeros(n))  # (C,)
        self._checked = False

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        penalty = l0_penalty(model, self.l0_penalty_normalization).to(loss)
        # × sample_size: fairseq divides gradients by the summed sample size (see docstring).
        loss = loss + self.l0_lambda * penalty * sample_size
        logging_output["l0_penalty"] = penalty.item() * sample_size
        if self.targets:
            term = self._budget_term(model, sample_size, logging_output)
            loss = loss + term.to(loss) * sample_size
        logging_output["loss"] = loss.data
        if self.trajectory.interval and model.training:  # every N-th update: gates to a file
            self.trajectory.record(num_updates_of(model), lambda: dict(gates_by_name(model)))
        with torch.no_grad():
            gates = stack_by_site(dict(gates_by_name(model)), HardConcreteGate.deterministic)
            for site, prob_open in prob_open_by_site(model).items():
                expected = prob_open.sum().item()
                n_open = (gates[site] > 0).sum().item()
                logging_output[_metric("exp_open", site)] = expected * sample_size
                logging_output[_metric("open", site)] = n_open * sample_size
        return loss, sample_size, logging_output

    def _budget_term(self, model, sample_size, logging_output) -> torch.Tensor:
        """L_budget (differentiable in the gates and, reversed, in λ); logs its state."""
        prob_open = prob_open_by_site(model)  # site -> (layers, heads)
        gated = {s: p.numel() for s, p in prob_open.items()}
        if not self._checked:
            budget.check_targets(self.targets, gated)
            self._checked = True
        names = list(self.targets)
        expected = budget.expected_open(prob_open, names)  # (C,)
        start = torch.tensor([float(budget.heads_in(gated, c)) for c in names]).to(expected)
        goal = torch.tensor([float(self.targets[c]) for c in names]).to(expected)
        updates = num_updates_of(model)
        target = budget.ramped_target(
            start, goal, updates, self.target_heads_warmup_updates
        )  # (C,)
        lambda_1 = budget.gradient_ascent(self.lambda_1) * self.target_heads_lr_scale  # (C,)
        lambda_2 = budget.gradient_ascent(self.lambda_2) * self.target_heads_lr_scale  # (C,)
        term = budget.lagrangian_term(
            expected, target, lambda_1.to(expected), lambda_2.to(expected)
        )
        logging_output["budget_term"] = term.item() * sample_size
        for i, c in enumerate(names):
            for prefix, value in zip(BUDGET_PREFIXES, (target, expected, lambda_1, lambda_2)):
                logging_output[_metric(prefix, c)] = value[i].item() * sample_size
        if self.target_heads_rounding and updates >= self.target_heads_warmup_updates:
            term = term + self.target_heads_rounding * budget.rounding_term(prob_open, self.targets)
        return term

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        """Restore λ on resume; a checkpoint without them (stock, --l0-lambda) keeps λ = 0."""
        if not self.targets:
            return super().load_state_dict(state_dict or {}, strict=strict, **kwargs)
        if not state_dict or "lambda_1" not in state_dict:
            logger.info("--target-heads: the checkpoint has no multipliers; starting from λ = 0")
            return None
        if state_dict["lambda_1"].shape != self.lambda_1.shape:
            raise HeadpruneError(
                f"--target-heads: the checkpoint has {state_dict['lambda_1'].numel()} budget(s) "
                f"but --target-heads {','.join(self.targets)} has {self.lambda_1.numel()}: "
                "resume with the checkpoint's --target-heads or pass --reset-optimizer and "
                "start again"
            )
        return super().load_state_dict(state_dict, strict=strict, **kwargs)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if sample_size == 0:
            return
        keys = ["l0_penalty", "budget_term"]
        keys += [_metric(p, s) for p in STAT_PREFIXES for s in SITES]
        keys += [_metric(p, c) for p in BUDGET_PREFIXES for c in (*SITES, budget.TOTAL)]
        for key in dict.fromkeys(keys):
            if any(key in log for log in logging_outputs):
                value = sum(log.get(key, 0) for log in logging_outputs) / sample_size
                metrics.log_scalar(key, value, sample_size, round=3)
