"""``gated_transformer``: fairseq's transformer with a Hard Concrete gate on every head.

Implements the model of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, section 6):
the stock transformer of Vaswani et al. 2017 whose heads in encoder self-attention
(``enc-self``), decoder self-attention (``dec-self``) and encoder-decoder attention
(``dec-enc``) each get a stochastic gate (Louizos et al. 2018). With ``--freeze-decoder``
only the encoder (and any gates) train: Voita's encoder-only pruning protocol, under which
head functions cannot migrate to the decoder.

The model is the stock ``TransformerModel`` (every ``--arch transformer*`` flag and preset
works) with gates installed at the seam described in ``gated_attention``. A converged stock
checkpoint loads into it (``--finetune-from-model`` or ``--restore-file`` with the
``--reset-*`` flags): the missing gates are created open.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)
from fairseq.modules import MultiheadAttention
from torch import nn

from fairseq_headprune import schedule_check
from fairseq_headprune.checkpoint_fit import check_fit
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.gate_flags import DEFAULT_SITES, gate_defaults
from fairseq_headprune.gated_attention import head_gates, install_head_gate
from fairseq_headprune.hard_concrete import (
    DEFAULT_INIT_LOG_ALPHA,
    DEFAULT_LR_SCALE,
    DEFAULT_STRETCH,
    DEFAULT_TEMPERATURE,
    check_gate_hparams,
)
from fairseq_headprune.pruning import parse_kept_heads, shrink_to_kept
from fairseq_headprune.sites import (
    ENC_SELF,
    GATE_KEY,
    SITES,
    attention_modules,
    parse_sites,
    site_of,
)

logger = logging.getLogger(__name__)

# The task attribute through which build_model tells the criterion the gated heads per type.
GATED_HEADS_ATTR = "headprune_gated_heads"


def _module_key(model: nn.Module, module: nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name
    raise KeyError("module not found in model")


@register_model("gated_transformer")
class GatedTransformerModel(TransformerModel):
    """Transformer with per-head Hard Concrete gates (Voita et al. 2019)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        # fmt: off
        parser.add_argument("--head-gates", type=str, metavar="SITES",
                            help="comma list of attention types whose heads get a gate: "
                                 f"{', '.join(SITES)}, or 'none' (default: {DEFAULT_SITES})")
        parser.add_argument("--head-gate-temperature", type=float, metavar="T",
                            help="Hard Concrete temperature β (default: "
                                 f"{DEFAULT_TEMPERATURE}, as in Voita et al.)")
        parser.add_argument("--head-gate-stretch-low", type=float, metavar="L",
                            help=f"stretch interval lower end l < 0 (default: {DEFAULT_STRETCH[0]})")  # noqa: E501
        parser.add_argument("--head-gate-stretch-high", type=float, metavar="R",
                            help=f"stretch interval upper end r > 1 (default: {DEFAULT_STRETCH[1]})")  # noqa: E501
        parser.add_argument("--head-gate-init-log-alpha", type=float, metavar="A",
                            help="initial log α of new gates; the default "
                                 f"{DEFAULT_INIT_LOG_ALPHA} starts them fully open in evaluation")
        # a default here, not in gate_defaults: a saved config without it means the old 1
        parser.add_argument("--head-gate-lr-scale", type=float, metavar="K",
                            default=DEFAULT_LR_SCALE,
                            help="gates move K times faster than the weights under Adam "
                                 "(log α = K·θ, θ the trained parameter): a gate closes in "
                                 "about 5.4 / (lr·K) updates; keep lr·K ≈ 0.01 "
                                 f"(default: {DEFAULT_LR_SCALE:g}, for --lr 5e-4)")
        parser.add_argument("--allow-slow-gates", action="store_true",
                            help="train even if the schedule check finds that a gate cannot "
                                 "close within the run's updates at this lr and gate scale")
        parser.add_argument("--kept-heads", type=str, metavar="JSON",
                            help="build a physically pruned model: JSON (inline or a file, as "
                                 "written by `fairseq-headprune export`) of the original head "
                                 "indices kept per attention type and layer")
        parser.add_argument("--freeze-decoder", action="store_true",
                            help="do not update decoder parameters (gates placed in the decoder "
                                 "still train): Voita et al.'s encoder-only pruning protocol. "
                                 "Shared embeddings count as decoder parameters and stay frozen")
        parser.add_argument("--train-shared-embeddings", action="store_true",
                            help="with --freeze-decoder and --share-all-embeddings, keep training "
                                 "the token embeddings shared by encoder and decoder")
        # fmt: on

    @classmethod
    def build_model(cls, args, task):
        gate_defaults(args)
        sites = parse_sites(args.head_gates)
        stretch = (args.head_gate_stretch_low, args.head_gate_stretch_high)
        check_gate_hparams(
            args.head_gate_temperature,
            stretch,
            init_log_alpha=args.head_gate_init_log_alpha,
            lr_scale=args.head_gate_lr_scale,
        )
        if args.freeze_decoder and ENC_SELF not in sites:
            raise HeadpruneError(
                "--freeze-decoder prunes the encoder only, but --head-gates "
                f"'{args.head_gates}' puts no gate on enc-self: nothing would be pruned"
            )
        model = super().build_model(args, task)
        model.apply_kept_heads(parse_kept_heads(args.kept_heads))
        for site, _, attn in attention_modules(model):
            if site in sites and isinstance(attn, MultiheadAttention):
                install_head_gate(
                    attn,
                    temperature=args.head_gate_temperature,
                    stretch=stretch,
                    init_log_alpha=args.head_gate_init_log_alpha,
                    lr_scale=args.head_gate_lr_scale,
                )
        if args.freeze_decoder:
            model.freeze_decoder(train_shared_embeddings=args.train_shared_embeddings)
        # the criterion, built next from the same task, checks --target-heads against these
        setattr(task, GATED_HEADS_ATTR, model.gated_heads_per_site())
        schedule_check.remember_task(model, task)
        return model

    def train(self, mode: bool = True):
        if mode:  # the trainer's first step: can a gate close within the run?
            schedule_check.on_train(self)
        return super().train(mode)

    def apply_kept_heads(self, kept: dict[str, list[list[int]]]) -> None:
        """Shrink attention modules to the kept heads' shapes, and FFNs to the kept neurons'
        (``enc-ffn`` / ``dec-ffn``); the weights are loaded after."""
        shrink_to_kept(self, kept)

    def set_num_updates(self, num_updates: int) -> None:
        """Called by fairseq's trainer every update; the L0 criterion reads it."""
        super().set_num_updates(num_updates)
        self.num_updates = num_updates

    def gated_heads_per_site(self) -> dict[str, int]:
        """Number of gated heads per attention type (types without gates left out)."""
        counts: dict[str, int] = defaultdict(int)
        for site, _, gate in head_gates(self):
            counts[site] += gate.theta.numel()
        return {s: counts[s] for s in SITES if s in counts}

    @property
    def gated_sites(self) -> tuple[str, ...]:
        return tuple(s for s in SITES if any(site == s for site, _, _ in head_gates(self)))

    def freeze_decoder(self, train_shared_embeddings: bool = False) -> None:
        """Stop gradients to every decoder parameter except head gates."""
        shared = {id(p) for p in self.encoder.parameters()}
        frozen = 0
        for name, p in self.decoder.named_parameters():
            if name.endswith(GATE_KEY):
                continue
            if train_shared_embeddings and id(p) in shared:
                continue
            p.requires_grad_(False)
            frozen += p.numel()
        logger.info(f"--freeze-decoder: {frozen:,} decoder parameters frozen")

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        self._add_missing_gates(state_dict, prefix)
        self._check_shapes(state_dict, prefix)

    def _add_missing_gates(self, state_dict: dict, prefix: str) -> None:
        """Open gates for a stock checkpoint; refuse a gated one with other gated sites."""
        expected = {
            prefix + _module_key(self, gate) + ".theta": (site, gate)
            for site, _, gate in head_gates(self)
        }
        present = {k for k in state_dict if k.startswith(prefix) and k.endswith(GATE_KEY)}
        if not present:
            for key, (_, gate) in expected.items():
                state_dict[key] = gate.theta.detach().clone()
            if expected:
                logger.info(f"checkpoint has no head gates: created {len(expected)} open gates")
            return
        if present != set(expected):
            found = sorted({site_of(k) for k in present}, key=SITES.index)
            raise HeadpruneError(
                f"the checkpoint was trained with --head-gates {','.join(found)} but this "
                f"model has --head-gates {','.join(self.gated_sites) or 'none'}: resume "
                "with the checkpoint's --head-gates"
            )

    def _check_shapes(self, state_dict: dict, prefix: str) -> None:
        attention = {
            prefix + _module_key(self, attn): (site, i, attn)
            for site, i, attn in attention_modules(self)
        }
        kept = getattr(self.args, "kept_heads", None)
        check_fit(self.state_dict(), state_dict, prefix, attention, kept)


def num_updates_of(model: nn.Module) -> int:
    """``model.num_updates`` (set every update by the trainer), through DDP wrappers."""
    while not hasattr(model, "num_updates") and isinstance(
        getattr(model, "module", None), nn.Module
    ):
        model = model.module
    return int(getattr(model, "num_updates", 0) or 0)


@register_model_architecture("gated_transformer", "gated_transformer")
def gated_transformer(args):
    gate_defaults(args)
    base_architecture(args)


@register_model_architecture("gated_transformer", "gated_transformer_iwslt_de_en")
def gated_transformer_iwslt_de_en(args):
    gate_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("gated_transformer", "gated_transformer_wmt_en_de")
def gated_transformer_wmt_en_de(args):
    gate_defaults(args)
    transformer_wmt_en_de(args)


@register_model_architecture("gated_transformer", "gated_transformer_vaswani_wmt_en_de_big")
def gated_transformer_vaswani_wmt_en_de_big(args):
    gate_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
