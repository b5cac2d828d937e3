"""Records of post-training pruned models (Kwon et al. 2022, "A Fast Post-Training Pruning
Framework for Transformers") for the study's tables.

    python -m recipes.study.posttrain record --eval-dir EVAL/NAME --run RUN [--method M]
        [--setting TEXT | --after TEXT] [--checkpoint CKPT] [--reference NAME] [--seed S]
    python -m recipes.study.posttrain reference --eval-dir EVAL/NAME --checkpoint CKPT
        --setting TEXT --seed S

reads ``RUN/prune.json`` (``fairseq-headprune prune --json-out``) and, when there,
``RUN/bench.json`` or ``--bench`` (``fairseq-headprune bench --json-out``; a fine-tuned model
generates other lengths, so it has its own) and writes ``EVAL/NAME/model.json``
(``recipes.study.records``): heads kept per attention type and FFN neurons kept per layer
kind out of the full model's, parameters, the multiply-add model's predicted beam-search
speed-up and the measured one per batch size, and the run folder (``run_dir``, relative).
``reference`` records the full model fine-tuned as long as the pruned ones (method
``baseline``, its difference taken to the baseline), the fine-tuned models' fair reference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fairseq_headprune.posttrain.command import after_search
from recipes.study.controls import write_json
from recipes.study.records import FFN_SITES, SITES


def kept_of(masks: dict[str, list[float]]) -> dict[str, list[int]]:
    """{site: [kept, total]} from prune.json's per-layer mask values (``"enc-self.0"`` …)."""
    out: dict[str, list[int]] = {}
    for key, values in masks.items():
        site = key.rsplit(".", 1)[0]
        kept, total = out.setdefault(site, [0, 0])
        out[site] = [kept + sum(v != 0 for v in values), total + len(values)]
    return out


def measured_speedups(bench: dict, beam_row: str = "generate beam") -> dict[str, float]:
    """{batch size: full/pruned time of beam-search generation} from a bench report."""
    return {
        str(r["batch"]): round(r["speedup"], 3)
        for r in bench.get("rows", [])
        if r["what"].startswith(beam_row)
    }


def make_record(run: Path, eval_dir: Path, args: argparse.Namespace) -> dict:
    prune = json.loads((run / "prune.json").read_text())
    counts = kept_of(prune["masks"])
    sites = prune.get("sites", [])  # prune --sites: the kinds the search could prune
    scope = f" of {','.join(sites)}" if 0 < len(sites) < len(SITES + FFN_SITES) else ""
    if "tune" in prune:  # name the steps that ran
        n = prune.get("search_steps", 1)
        steps = ([f"{n} search steps"] if n > 1 else []) + after_search(prune)
        scope += "".join(f", {step}" for step in steps)
    else:  # a report of Kwon et al.'s steps by default (rearranged, masks tuned)
        scope += "".join(f" without {stage}" for stage, key in (("rearrangement", "rearranged"),
                         ("tuning", "tuned")) if not prune.get(key, True))  # fmt: skip
    record = {
        "method": args.method,
        "setting": args.setting or f"{prune['budget']}{scope}, {args.after}",
        "checkpoint": args.checkpoint or str(run / "pruned.pt"),
        "heads": {s: counts[s] for s in SITES if s in counts},
        "ffn": {s: counts[s] for s in FFN_SITES if s in counts},
        "params": prune["params_after"],
        "predicted_speedup": round(prune["predicted_speedup"], 3),
        "prune_seconds": round(prune["seconds"], 1),
        "run_dir": os.path.relpath(run, eval_dir),
    }
    bench_file = Path(args.bench) if args.bench else run / "bench.json"
    if bench_file.is_file():
        bench = json.loads(bench_file.read_text())
        record["speedup"] = measured_speedups(bench)
        if args.bench:  # not the run's own: publish copies it next to the run's records
            record["bench"] = os.path.relpath(bench_file, eval_dir)
        record["params"] = bench["params"]["pruned"]
    for key in ("reference", "seed"):
        if getattr(args, key) is not None:
            record[key] = getattr(args, key)
    return record


def cmd_record(args: argparse.Namespace) -> None:
    eval_dir = Path(args.eval_dir)
    if not (Path(args.run) / "prune.json").is_file():
        raise SystemExit(f"error: --run {args.run}: no prune.json (fairseq-headprune prune)")
    eval_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(eval_dir / "model.json"), make_record(Path(args.run), eval_dir, args))


def cmd_reference(args: argparse.Namespace) -> None:
    """model.json of the full model fine-tuned as long as the pruned ones (their reference)."""
    from recipes.study.controls import head_totals

    totals = head_totals(args.checkpoint)
    record = {
        "method": "baseline",
        "setting": args.setting,
        "checkpoint": args.checkpoint,
        "heads": {s: [n, n] for s, n in totals.items()},
        "seed": args.seed,
        "reference": "baseline",
    }
    write_json(str(Path(args.eval_dir) / "model.json"), record)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("record", help="write EVAL/NAME/model.json of a post-training run")
    p.add_argument("--eval-dir", required=True, help="the evaluation folder (eval/NAME)")
    p.add_argument("--run", required=True, help="the run folder with prune.json, bench.json")
    p.add_argument("--method", default="posttrain", choices=("posttrain", "posttrain+ft"))
    p.add_argument("--setting", help="the table's setting column (default: the budget, the "
                   "steps of prune that ran, --after)")  # fmt: skip
    p.add_argument("--after", default="no retraining", help="what followed prune, for the "
                   "default setting (e.g. '2 epochs')")  # fmt: skip
    p.add_argument("--checkpoint", help="the evaluated checkpoint (default: RUN/pruned.pt)")
    p.add_argument("--reference", help="NAME of the fair reference (default: the baseline)")
    p.add_argument("--seed", type=int, help="fine-tuning seed (posttrain+ft)")
    p.add_argument("--bench", help="the model's bench.json (default: RUN/bench.json)")
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("reference", help="write EVAL/NAME/model.json of the fine-tuned full model")
    p.add_argument("--eval-dir", required=True, help="the evaluation folder (eval/NAME)")
    p.add_argument("--checkpoint", required=True, help="the fine-tuned full model")
    p.add_argument("--setting", required=True, help="the table's setting column")
    p.add_argument("--seed", type=int, required=True, help="fine-tuning seed")
    p.set_defaults(func=cmd_reference)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
