"""``fairseq-headprune export``: write a physically pruned, loadable fairseq checkpoint.

The last step of Voita et al. 2019's pipeline ("Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"), done for real: closed heads
are removed from the tensors (see ``pruning``), not masked. Sources of the heads to keep:

- a ``gated_transformer`` checkpoint: heads whose deterministic gate is > 0, gates folded;
- any transformer checkpoint plus a mask (``--mask``): JSON ``{"enc-self": [[kept head
  indices] per layer], …}`` or 0/1 rows ``[[1, 0, …], …]`` with one entry per head — written by
  hand, by the scorer, or by a random/importance policy, so every method yields the same kind
  of model for comparison. With a gated checkpoint the mask decides and the gates are folded.

The output is a ``gated_transformer`` checkpoint with ``kept_heads`` in its config and no gates:
stock ``fairseq-generate``/``fairseq-interactive`` load it strictly with ``--user-dir``; to
fine-tune it, pass ``--arch gated_transformer --kept-heads OUT.heads.json --head-gates none``
with ``--finetune-from-model OUT``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from fairseq_headprune import gate_decision
from fairseq_headprune.checkpoint_io import (
    atomic_save,
    gates_from_state,
    half_weights,
    head_layout,
    load_checkpoint,
    model_args,
)
from fairseq_headprune.gate_flags import gate_defaults
from fairseq_headprune.pruning import parse_kept_heads, prune_state_dict
from fairseq_headprune.sites import (
    DEC_ENC,
    DEC_SELF,
    ENC_SELF,
    FFN_SITES,
    GATE_SUFFIX,
    layer_of,
    site_of,
    site_order,
)


def attention_layout(state: dict) -> dict[str, tuple[int, int, list[int]]]:
    """Attention prefix → (heads now, head dim, original indices of those heads)."""
    args = model_args(state)
    if (
        not hasattr(args, "encoder_attention_heads")
        or "encoder.layers.0.fc1.weight" not in state["model"]
    ):
        raise ValueError("the checkpoint is not a fairseq transformer")
    kept = parse_kept_heads(getattr(args, "kept_heads", None))
    heads = {site: n for site, (_, n) in head_layout(state).items()}
    dims = {ENC_SELF: args.encoder_embed_dim, DEC_SELF: args.decoder_embed_dim}
    dims[DEC_ENC] = args.decoder_embed_dim
    layout = {}
    for key in state["model"]:
        if key.endswith(("_attn.q_proj.weight", "_attn.out_proj_bias")):
            prefix = key.rsplit(".", 2)[0] if key.endswith("weight") else key.rsplit(".", 1)[0]
            site, layer = site_of(prefix), layer_of(prefix)
            original = kept[site][layer] if site in kept else list(range(heads[site]))
            layout[prefix] = (len(original), dims[site] // heads[site], original)
    return layout


def mask_to_kept(mask: dict, layout: dict) -> dict[str, list[int]]:
    """A user mask → prefix → positions (in the checkpoint's modules) of the heads to keep.

    ``mask``: ``{type: [row per layer]}``; a row is either original head indices to keep
    (``[0, 5]``) or one boolean per head now in the layer (``[true, false, …]``).
    """
    by_site: dict[str, dict[int, str]] = {}
    for prefix in layout:
        by_site.setdefault(site_of(prefix), {})[layer_of(prefix)] = prefix
    unknown = [s for s in mask if s not in by_site]
    if unknown:
        raise ValueError(f"the mask names attention types {unknown}; the model has {list(by_site)}")
    kept = {}
    for site, rows in mask.items():
        if len(rows) != len(by_site[site]):
            raise ValueError(
                f"the mask has {len(rows)} layers for {site}; the model has {len(by_site[site])}"
            )
        for i, row in enumerate(rows):
            prefix = by_site[site][i]
            _, _, original = layout[prefix]
            if row and all(isinstance(v, bool) for v in row):
                if len(row) != len(original):
                    raise ValueError(
                        f"the mask row for {site} layer {i} has {len(row)} entries; the layer "
                        f"has {len(original)} heads"
                    )
                kept[prefix] = [p for p, v in enumerate(row) if v]
                continue
            missing = [h for h in row if h not in original]
            if missing:
                raise ValueError(
                    f"the mask names {site} layer {i} heads {missing}, which the model does not "
                    f"have (it has {original})"
                )
            kept[prefix] = [original.index(h) for h in sorted(set(row))]
    return kept


def export_pruned(
    path: str | Path,
    out: str | Path,
    mask: dict | None = None,
    force: bool = False,
    force_budget: bool = False,
    fp16: bool = False,
) -> dict:
    """Write the pruned checkpoint ``out`` (and ``out.heads.json``); return a report.

    Gates that do not decide the heads to keep (``gate_decision``) are refused unless
    ``force_budget``. The report's ``gate_change`` and ``removed_gate`` are 0 exactly when the
    pruned model equals the gated model in evaluation (``gate_decision.folding_changes``).
    ``fp16``: store the weights in half precision, cast after the gates are folded.
    """
    out = Path(out)
    heads_json = out.with_name(out.name + ".heads.json")
    for written in (out, heads_json):
        if written.exists() and not force:
            raise FileExistsError(f"{written} exists; pass --force to overwrite it")
    state = load_checkpoint(path)
    layout = attention_layout(state)
    gate_modules = gates_from_state(state)
    gates = {p: g.deterministic().detach() for p, g in gate_modules.items()}
    det = {p: g.clone() for p, g in gates.items()}
    notes: list[str] = []
    if mask is not None:
        kept = mask_to_kept(mask, layout)
    elif gates:
        if not force_budget:
            gate_decision.check_decided(gate_modules, _target_heads_spec(state))
        kept = _kept_by_gates(state, gate_modules, gates, notes)
    else:
        raise ValueError(f"{path} has no head gates: give a --mask of the heads to keep")
    shapes = {p: (n, d) for p, (n, d, _) in layout.items()}
    pruned = prune_state_dict(state["model"], shapes, kept, gates)
    kept_heads = _kept_heads_record(state, layout, kept)
    save_pruned_checkpoint(state, pruned, kept_heads, out, force, fp16)

    gate_change, removed_gate = gate_decision.folding_changes(det, gates, kept)
    return {
        "out": str(out),
        "kept_heads": kept_heads,
        "heads": {s: [sum(map(len, rows)), _count(layout, s)] for s, rows in kept_heads.items()},
        "notes": notes,
        "gate_change": gate_change,
        "removed_gate": removed_gate,
        "params_before": n_params(state["model"]),
        "params_after": n_params(pruned),
    }


def _kept_by_gates(
    state: dict, gate_modules: dict, gates: dict[str, torch.Tensor], notes: list[str]
) -> dict[str, list[int]]:
    """Prefix → positions of the heads whose deterministic gate is > 0, or, for the types a
    ``--target-heads`` budget covers, its top-K heads (their closed gates set to 1 in
    ``gates``, a note added to ``notes``)."""
    kept = {p: torch.nonzero(g > 0).flatten().tolist() for p, g in gates.items()}
    budget_kept = _target_heads_kept(state, gate_modules) or {}
    if any(kept[p] != heads for p, heads in budget_kept.items()):
        n_det = sum(len(kept[p]) for p in budget_kept)
        n_k = sum(map(len, budget_kept.values()))
        notes.append(
            f"the deterministic gates leave {n_det} budgeted heads open; keeping the {n_k} "
            "heads of highest P(open) that the run's --target-heads asks for"
        )
        for p, heads in budget_kept.items():  # a kept head whose gate is 0 counts fully
            gates[p][[h for h in heads if gates[p][h] == 0]] = 1.0
        kept.update(budget_kept)
    return kept


def _kept_heads_record(state: dict, layout: dict, kept: dict) -> dict[str, list[list[int]]]:
    """The pruned model's ``kept_heads``: original indices of the kept heads per type and
    layer, and the FFN neurons an earlier pruning kept."""
    kept_heads: dict[str, list[list[int]]] = {}
    for prefix in sorted(layout, key=site_order):
        n, _, original = layout[prefix]
        positions = kept.get(prefix, list(range(n)))
        kept_heads.setdefault(site_of(prefix), []).append([original[p] for p in positions])
    previous = parse_kept_heads(getattr(model_args(state), "kept_heads", None))
    kept_heads.update({s: rows for s, rows in previous.items() if s in FFN_SITES})
    return kept_heads


def save_pruned_checkpoint(
    state: dict,
    pruned: dict,
    kept_heads: dict,
    out: str | Path,
    force: bool = False,
    fp16: bool = False,
) -> None:
    """Write ``pruned`` weights as a ``gated_transformer`` checkpoint whose config records
    ``kept_heads`` (no gates, no optimizer state), and ``out.heads.json`` next to it;
    ``fp16``: the weights in half precision (:func:`checkpoint_io.half_weights`)."""
    out = Path(out)
    args = copy.copy(model_args(state))
    args.arch = args._name = "gated_transformer"
    args.kept_heads = json.dumps(kept_heads)
    args.head_gates = "none"
    args.freeze_decoder = False
    gate_defaults(args)
    cfg = dict(state.get("cfg") or {})
    cfg["model"] = args
    new_state = {
        "cfg": cfg,
        "args": None,
        "model": half_weights(pruned) if fp16 else pruned,
        "optimizer_history": state.get("optimizer_history", []),
        "extra_state": state.get("extra_state", {}),
        "last_optimizer_state": None,
    }
    atomic_save(new_state, out, force=force)
    heads_json = out.with_name(out.name + ".heads.json")
    tmp = heads_json.with_name(heads_json.name + ".tmp")
    tmp.write_text(json.dumps(kept_heads) + "\n")
    tmp.replace(heads_json)


def n_params(sd: dict) -> int:
    """Weights of a state dict; shared tensors (tied embeddings) counted once."""
    unique = {v.data_ptr(): v.numel() for k, v in sd.items() if not k.endswith(NOT_WEIGHTS)}
    return sum(unique.values())


# state-dict entries that are not model weights: the gates (folded into out_proj) and
# fairseq's buffers (format versions, the sinusoidal embeddings' dtype holder)
NOT_WEIGHTS = (GATE_SUFFIX, ".version", "._float_tensor")


def _target_heads_spec(state: dict) -> str | None:
    """The ``--target-heads`` of the run that saved ``state`` (None: no budget)."""
    criterion = (state.get("cfg") or {}).get("criterion") or {}
    spec = criterion.get("target_heads") if isinstance(criterion, dict) else None
    return spec if spec and str(spec).strip().lower() != "none" else None


def _target_heads_kept(state: dict, gate_modules: dict) -> dict[str, list[int]] | None:
    """Top-K heads by P(open) of the attention types that ``--target-heads`` budgeted."""
    spec = _target_heads_spec(state)
    if not spec:
        return None
    prefixes = gate_decision.by_site(gate_modules)
    masks = gate_decision.budget_masks(gate_modules, spec)
    return {
        p: torch.nonzero(mask[i]).flatten().tolist()
        for s, mask in masks.items()
        for i, p in enumerate(prefixes[s])
    }


def mask_from_scores(
    heads_json: str | Path,
    metric: str,
    k: int,
    sites: Sequence[str] = (ENC_SELF,),
    ascending: bool = False,
) -> dict[str, list[list[int]]]:
    """Keep the ``k`` heads of ``sites`` ranked best by ``metric`` of a scorer's heads.json.

    Heads of other attention types are all kept. ``metric`` ``random:SEED`` ranks randomly.
    """
    with open(heads_json, encoding="utf-8") as f:
        report = json.load(f)
    records = [r for r in report["heads"] if r["site"] in sites]
    if not records:
        raise ValueError(f"{heads_json} has no heads of {list(sites)}")
    if metric.startswith("random:"):
        g = torch.Generator().manual_seed(int(metric.split(":", 1)[1]))
        values = torch.rand(len(records), generator=g).tolist()
    else:
        if metric not in records[0]:
            names = sorted(k for k, v in records[0].items() if isinstance(v, (int, float)))
            raise ValueError(f"heads.json has no metric {metric!r}; numeric ones: {names}")
        worst = float("inf") if ascending else float("-inf")
        values = [worst if r[metric] is None else float(r[metric]) for r in records]
    if not 0 <= k <= len(records):
        raise ValueError(f"--top-k {k}: {list(sites)} have {len(records)} heads")
    order = sorted(range(len(records)), key=lambda i: values[i], reverse=not ascending)
    chosen = {(records[i]["site"], records[i]["layer"], records[i]["head"]) for i in order[:k]}
    shape = report["sites"]
    return {
        s: [
            [h for h in range(shape[s]["heads"]) if (s, i, h) in chosen]
            for i in range(shape[s]["layers"])
        ]
        for s in sites
        if s in shape
    }


def _count(layout: dict, site: str) -> int:
    return sum(n for p, (n, _, _) in layout.items() if site_of(p) == site)
