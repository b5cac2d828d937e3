"""The attention types and FFN kinds of an encoder–decoder transformer, and their names.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019) study heads by attention type: encoder
self-attention (``enc-self``), decoder self-attention (``dec-self``) and encoder–decoder
attention (``dec-enc``). Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for
Transformers", NeurIPS 2022) also prune FFN neurons, here ``enc-ffn`` and ``dec-ffn``.

The one home of that vocabulary: the names, the head gate's state-dict key, the mapping
between a module name (``decoder.layers.3.encoder_attn``) and its (type, layer), walkers over
a model's attention modules and FFNs. No fairseq import: the model walkers only read
``encoder.layers`` and ``decoder.layers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import nn

from fairseq_headprune.errors import HeadpruneError

ENC_SELF, DEC_SELF, DEC_ENC = "enc-self", "dec-self", "dec-enc"
# The attention types, in the order every table and report lists them.
SITES = (ENC_SELF, DEC_SELF, DEC_ENC)
ENC_FFN, DEC_FFN = "enc-ffn", "dec-ffn"
FFN_SITES = (ENC_FFN, DEC_FFN)
# Every kind of prunable unit: heads of the attention types, then FFN neurons.
UNIT_SITES = SITES + FFN_SITES
# A layer's heads or neurons of one kind: (site, layer index).
Unit = tuple[str, int]

# The head gate's parameter under its attention module, and that key's state-dict suffix.
GATE_KEY = "head_gate.theta"
GATE_SUFFIX = "." + GATE_KEY

# The attribute of a transformer layer that holds each type's attention module.
_ATTENTION_ATTR = {ENC_SELF: "self_attn", DEC_SELF: "self_attn", DEC_ENC: "encoder_attn"}


def parse_sites(
    value: str | None, flag: str = "--head-gates", choices: tuple[str, ...] = SITES
) -> tuple[str, ...]:
    """``"enc-self,dec-enc"`` → ``("enc-self", "dec-enc")`` in canonical order; ``none`` → ().

    ``choices``: the names allowed (attention types; ``UNIT_SITES`` adds the FFN kinds).
    """
    if value is None or value.strip().lower() in ("", "none"):
        return ()
    names = [s.strip() for s in value.split(",") if s.strip()]
    unknown = [s for s in names if s not in choices]
    if unknown:
        kind = "attention type(s)" if choices == SITES else "name(s)"
        raise HeadpruneError(
            f"{flag}: unknown {kind} {unknown}; choose from {list(choices)} or 'none'"
        )
    return tuple(s for s in choices if s in names)


def site_of(name: str) -> str:
    """The attention type of a parameter or module name (``encoder.layers.0.self_attn…``)."""
    parts = name.split(".")
    if "encoder_attn" in parts:
        return DEC_ENC
    if "decoder" in parts:
        return DEC_SELF
    if "encoder" in parts:
        return ENC_SELF
    raise ValueError(f"{name!r} is not a transformer attention parameter")


def layer_of(name: str) -> int:
    """The layer index of a parameter or module name (``….layers.3.self_attn…`` → 3)."""
    return int(name.split("layers.")[1].split(".")[0])


def site_order(name: str) -> tuple[int, int]:
    """Sort key of an attention name: canonical type order, then layer."""
    return SITES.index(site_of(name)), layer_of(name)


def group_by_site(names: Iterable[str]) -> dict[str, list[str]]:
    """Attention type (in canonical order) → its attention names in layer order."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names, key=site_order):
        groups.setdefault(site_of(name), []).append(name)
    return groups


def module_prefix(unit: Unit) -> str:
    """The state-dict prefix of a unit's module: its attention, or its layer for an FFN."""
    site, i = unit
    side = "encoder" if site.startswith("enc") else "decoder"
    if site in FFN_SITES:
        return f"{side}.layers.{i}"
    return f"{side}.layers.{i}.{_ATTENTION_ATTR[site]}"


def site_layers(model: nn.Module, site: str) -> list[nn.Module]:
    """The transformer layers that hold ``site``'s attention modules or FFNs."""
    side = model.encoder if site.startswith("enc") else model.decoder
    return list(side.layers)


def attention_modules(model: nn.Module) -> Iterator[tuple[str, int, nn.Module]]:
    """Yield ``(site, layer index, attention module)`` for every attention of a transformer."""
    for i, layer in enumerate(model.encoder.layers):
        yield ENC_SELF, i, layer.self_attn
    for i, layer in enumerate(model.decoder.layers):
        yield DEC_SELF, i, layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            yield DEC_ENC, i, layer.encoder_attn


def ffn_layers(model: nn.Module) -> Iterator[tuple[str, int, nn.Module]]:
    """Yield ``(site, layer index, layer)`` for the FFN of every encoder and decoder layer."""
    for i, layer in enumerate(model.encoder.layers):
        yield ENC_FFN, i, layer
    for i, layer in enumerate(model.decoder.layers):
        yield DEC_FFN, i, layer


def get_attention(layer: nn.Module, site: str) -> nn.Module:
    """The attention module of type ``site`` in a transformer layer."""
    return getattr(layer, _ATTENTION_ATTR[site])


def set_attention(layer: nn.Module, site: str, module: nn.Module) -> None:
    """Replace the attention module of type ``site`` in a transformer layer."""
    setattr(layer, _ATTENTION_ATTR[site], module)
