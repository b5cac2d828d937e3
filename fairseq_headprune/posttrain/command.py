"""``fairseq-headprune prune``: post-training pruning of heads and FFN neurons, no retraining.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", NeurIPS 2022),
for fairseq encoder–decoder transformers: masks on every head and FFN neuron (``masks``),
their diagonal Fisher information on calibration sentences (``fisher``), the mask search under
a multiply-add, latency or head budget, in ``--search-steps`` nested searches, and Kwon et
al.'s rearrangement within layers (``search``), layer-wise least squares: the kept units'
output weights refit and, with ``--reselect``, the kept units of each layer chosen by it
(``refit``, Frantar & Alistarh 2022), or Kwon et al.'s one scale per unit (``tuning``); then a
physically smaller checkpoint: refit weights and tuned values written into ``out_proj`` /
``fc2`` columns, pruned heads and neurons removed (``pruning``), the kept ones recorded in
the config's ``kept_heads`` (``export``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from fairseq import checkpoint_utils

from fairseq_headprune.checkpoint_io import load_checkpoint, model_args
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.export import attention_layout, n_params, save_pruned_checkpoint
from fairseq_headprune.macs import mac_terms, prunable_macs, total_macs
from fairseq_headprune.posttrain.fisher import calibration_batches
from fairseq_headprune.posttrain.latency import latency_budget, predicted_seconds
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.posttrain.refit import refit
from fairseq_headprune.posttrain.search import choose, parse_budget
from fairseq_headprune.posttrain.tuning import tune
from fairseq_headprune.pruning import parse_kept_heads, prune_ffn_state_dict, prune_state_dict
from fairseq_headprune.sites import (
    FFN_SITES,
    SITES,
    UNIT_SITES,
    module_prefix,
    parse_sites,
    site_layers,
)

TUNE_CHOICES = ("masks", "weights", "none")


def check_checkpoint(path: str) -> dict:
    """The checkpoint's state, or HeadpruneError if it is no encoder–decoder transformer."""
    try:
        state = load_checkpoint(path)
        attention_layout(state)
    except (FileNotFoundError, ValueError) as e:
        raise HeadpruneError(f"--path {path}: {e}") from e
    if "decoder.layers.0.encoder_attn.q_proj.weight" not in state["model"]:
        raise HeadpruneError(
            f"--path {path}: not an encoder–decoder transformer (no decoder–encoder attention)"
        )
    return state


def mean_lengths(batches: list[dict], pad: int) -> tuple[int, int]:
    """Mean source and target length (tokens, with EOS) of the calibration sentences."""
    src = sum(int((b["net_input"]["src_tokens"] != pad).sum()) for b in batches)
    tgt = sum(int((b["target"] != pad).sum()) for b in batches)
    n = sum(b["nsentences"] for b in batches)
    return max(1, round(src / n)), max(1, round(tgt / n))


def kept_heads_json(state: dict, model, keep: dict) -> dict[str, list[list[int]]]:
    """The ``kept_heads`` record of the pruned model: original indices of kept heads/neurons."""
    layout = attention_layout(state)
    previous = parse_kept_heads(getattr(model_args(state), "kept_heads", None))
    out: dict[str, list[list[int]]] = {}
    for site in UNIT_SITES:
        layers = site_layers(model, site)
        for i in range(len(layers)):
            if site in FFN_SITES:
                width = layers[i].fc1.out_features
                original = previous[site][i] if site in previous else list(range(width))
            else:
                _, _, original = layout[module_prefix((site, i))]
            positions = keep[site, i].nonzero().flatten().tolist() if (site, i) in keep else []
            out.setdefault(site, []).append([original[p] for p in positions])
    return out


def export(
    state: dict, model, masks: Masks, keep: dict, out: str, force: bool, weights: dict
) -> dict:
    """Put the refit ``weights`` (by parameter name) into the checkpoint's, fold the tuned
    masks into out_proj / fc2, remove the units ``keep`` drops, write ``out``."""
    params = state["model"]
    params = {**params, **{k: v.to(params[k]) for k, v in weights.items()}}
    layout = attention_layout(state)
    heads = {p: (n, d) for p, (n, d, _) in layout.items()}
    kept_pos, gates, ffn_kept, ffn_scales = {}, {}, {}, {}
    for unit, k in keep.items():
        prefix = module_prefix(unit)
        positions = k.nonzero().flatten().tolist()
        if unit[0] in FFN_SITES:
            ffn_kept[prefix], ffn_scales[prefix] = positions, masks.values[unit]
        else:
            kept_pos[prefix] = positions
            gates[prefix] = masks.values[unit] * masks.base(unit)
    pruned = prune_state_dict(params, heads, kept_pos, gates)
    pruned = prune_ffn_state_dict(pruned, ffn_kept, ffn_scales)
    kept = kept_heads_json(state, model, keep)
    save_pruned_checkpoint(state, pruned, kept, out, force)
    before, after = n_params(state["model"]), n_params(pruned)
    return {"kept_heads": kept, "params_before": before, "params_after": after}


def run_prune(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    if Path(args.out).exists() and not args.force:
        raise HeadpruneError(f"--out {args.out} exists; pass --force to overwrite it")
    budget = parse_budget(args.budget)
    if args.search_steps < 1:
        raise HeadpruneError(f"--search-steps {args.search_steps}: give a positive number")
    if args.reselect is None:
        args.reselect = args.tune == "weights"
    if args.reselect and args.tune != "weights":
        raise HeadpruneError(f"--reselect needs --tune weights, not --tune {args.tune}")
    args.sites = parse_sites(args.sites, "--sites", UNIT_SITES)
    if not args.sites or (budget.kind == "heads" and not set(args.sites) & set(SITES)):
        raise HeadpruneError(
            f"--sites {','.join(args.sites) or 'none'}: nothing for --budget {args.budget} to "
            f"prune; name attention types{'' if budget.kind == 'heads' else ' or FFN kinds'}"
        )
    state = check_checkpoint(args.path)
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.path], arg_overrides={"data": args.data}
    )
    model = model.float().eval()
    batches = calibration_batches(
        task, args.subset, args.calibration_sentences, args.calibration_batch_size, args.seed
    )
    src_len, tgt_len = mean_lengths(batches, model.decoder.dictionary.pad())
    if budget.kind == "latency":  # measured on the unmasked model
        args.latency_costs = latency_budget(args, task, model, budget.value, tgt_len)
    constant, terms = mac_terms(model, src_len, tgt_len, args.beam)
    masks = Masks(model)
    terms = {u: t for u, t in terms.items() if u in masks.values}
    stages = {"load and calibration data": time.perf_counter() - start}
    keep, latency = choose(args, task, model, masks, batches, terms)
    stages["importance and search"] = time.perf_counter() - start - sum(stages.values())
    masks.set({u: k.float() for u, k in keep.items()})
    errors, weights = {}, {}
    if args.tune == "masks":
        errors = tune(model, masks, batches)
    elif args.tune == "weights":
        errors, weights = refit(model, masks, batches, args.reselect)
        keep = {u: masks.values[u] != 0 for u in keep}
    stages["tuning"] = time.perf_counter() - start - sum(stages.values())
    if latency:
        floor, cost = latency["seconds_unprunable"], args.latency_costs[0]
        latency["seconds_pruned"] = predicted_seconds(floor, cost, keep)
    report = export(state, model, masks, keep, args.out, args.force, weights)
    stages["export"] = time.perf_counter() - start - sum(stages.values())
    kept_macs = prunable_macs(terms, {u: int(k.sum()) for u, k in keep.items()})
    full = total_macs(constant, terms)
    report.update(
        seconds=time.perf_counter() - start,
        seconds_by_stage=stages,
        budget=args.budget,
        sites=list(args.sites),
        search_steps=args.search_steps,
        rearranged=args.rearrange,
        reselected=args.reselect,
        tuned=args.tune != "none",
        tune=args.tune,
        calibration_sentences=sum(b["nsentences"] for b in batches),
        lengths={"src": src_len, "tgt": tgt_len, "beam": args.beam},
        macs={"full": full, "pruned": constant + kept_macs, "unprunable": constant},
        prunable_kept=kept_macs / (full - constant),
        predicted_speedup=full / (constant + kept_macs),
        max_speedup=full / max(constant, 1),
        latency=latency,
        tuning={f"{s}.{i}": e for (s, i), e in errors.items()},
        masks={f"{s}.{i}": v.tolist() for (s, i), v in masks.values.items()},
        out=args.out,
    )
    return report


def after_search(r: dict) -> list[str]:
    """What ran after the search, in the words the study's records use."""
    steps = ["rearranged"] if r["rearranged"] else []
    steps += ["units reselected"] if r.get("reselected") else []
    return steps + [{"weights": "weights refit", "masks": "masks tuned"}.get(r["tune"], "untuned")]


def format_report(r: dict) -> str:
    lines = [f"{site}: kept {sum(map(len, rows))}" for site, rows in r["kept_heads"].items()]
    m = r["macs"]
    if r.get("latency"):
        lat = r["latency"]
        lines.append(
            f"measured beam-search time: full {lat['seconds_full']:.3f} s, floor (no heads or "
            f"neurons) {lat['seconds_unprunable']:.3f} s; latency model for the pruned model "
            f"{lat['seconds_pruned']:.3f} s, a {lat['seconds_full'] / lat['seconds_pruned']:.2f}x"
            " speed-up"
        )
    lines += [
        f"calibration: {r['calibration_sentences']} sentences; MAC model at source length "
        f"{r['lengths']['src']}, target length {r['lengths']['tgt']}, beam {r['lengths']['beam']}",
        f"attention + FFN multiply-adds kept: {100 * r['prunable_kept']:.1f}% ({r['budget']})",
        f"search: {r['search_steps']} step(s), then {', '.join(after_search(r))}",
        f"beam-search multiply-adds: full {m['full']:,}, pruned {m['pruned']:,}; predicted "
        f"speed-up {r['predicted_speedup']:.2f}x (the output layer and embeddings, "
        f"{100 * m['unprunable'] / m['full']:.0f}% of the full model's, cap it at "
        f"{r['max_speedup']:.2f}x)",
        f"parameters: {r['params_before']:,} -> {r['params_after']:,}",
        f"pruning time: {r['seconds']:.1f} s ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in r["seconds_by_stage"].items())
        + ")",
        f"wrote {r['out']} and {r['out']}.heads.json",
    ]
    return "\n".join(lines)


def cmd_prune(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    report = run_prune(args)
    print(format_report(report))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


def add_prune_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune prune``."""
    p.add_argument("data", help="fairseq data-bin of the model (calibration sentences)")
    p.add_argument("--path", required=True, help="an encoder–decoder transformer checkpoint")
    p.add_argument(
        "--budget",
        required=True,
        help="macs:F keeps at most a fraction F in (0, 1] of the attention and FFN "
        "multiply-adds of beam search; latency:F a fraction F of the full model's measured "
        "beam-search-shaped decoding time; heads:K the K most important heads and every neuron",
    )
    p.add_argument("--out", required=True, help="the pruned checkpoint to write")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--subset", default="train", help="calibration subset (default: train)")
    p.add_argument("--calibration-sentences", type=int, default=2000, help="default: 2000")
    p.add_argument("--calibration-batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument(
        "--beam", type=int, default=5, help="beam of the MAC and latency models (default: 5)"
    )
    p.add_argument(
        "--latency-batch-size",
        type=int,
        default=16,
        help="with --budget latency:F: sentences per timed batch (default: 16)",
    )
    p.add_argument(
        "--allow-empty-cross-attention",
        action="store_true",
        help="let the search remove every head of a decoder–encoder attention layer",
    )
    p.add_argument(
        "--sites",
        default=",".join(UNIT_SITES),
        help="the attention types and FFN kinds the search may prune, comma-separated; the "
        "others are kept whole (default: all of " + ",".join(UNIT_SITES) + ")",
    )
    p.add_argument(
        "--rearrange",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Kwon et al.'s rearrangement of the kept units within each layer by Fisher cross "
        "terms (default: off; it lowered BLEU at every budget measured: docs/posttrain.md)",
    )
    p.add_argument(
        "--search-steps",
        type=int,
        default=3,
        help="reach the budget in this many searches, geometric steps, each among the units "
        "the previous one kept and with the Fisher information of the model pruned so far "
        "(default: 3; 1 is Kwon et al.'s one-shot search)",
    )
    p.add_argument(
        "--reselect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --tune weights: keep as many units in each layer as the search chose, but "
        "choose which ones by the refit's own least-squares error (greedy Optimal Brain "
        "Surgeon elimination) (default: on with --tune weights)",
    )
    p.add_argument(
        "--tune",
        choices=TUNE_CHOICES,
        default="weights",
        help="after the search, fit each layer to the unpruned model's output: weights, every "
        "output weight of the kept units and the bias; masks, one scale per kept head or "
        "neuron (Kwon et al.); none (default: weights)",
    )
    p.add_argument("--seed", type=int, default=1, help="draw of the calibration sentences")
    p.add_argument("--json-out", help="write the report as JSON here")
    p.set_defaults(func=cmd_prune)
