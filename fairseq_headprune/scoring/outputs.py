"""The ``score`` command's outputs: heads.json (schema ``heads.schema.json``), heads.csv,
one heatmap per metric, the ablation curve and summary.md, written atomically.

Head roles follow Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads
Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019): positional (≥ ``positional`` of
maxima at one offset), syntactic (beats the relation's positional baseline by ≥
``syntactic_margin``), rare-word (beats the average head of its attention type by ≥
``rare_margin``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from fairseq_headprune.sites import ENC_SELF

SCHEMA_PATH = Path(__file__).with_name("heads.schema.json")
HEAD_FIELDS = (
    "gate", "lrp", "lrp_raw", "confidence", "entropy", "positional_offset",
    "positional_fraction", "rare_word", "importance", "importance_raw", "output_norm",
    "ablation_delta_loss",
)  # fmt: skip
HEATMAP_FIELDS = tuple(f for f in HEAD_FIELDS if f not in ("gate", "lrp_raw", "importance_raw"))


def add_summaries(scores: dict, report: dict) -> None:
    """The syntax baselines and the similarity matrices of ``scores``, into ``report``."""
    if report["syntax"] is not None:
        report["syntax"]["baselines"] = {
            k[len("baseline_") :]: {
                "accuracy": float(v[ENC_SELF]),
                "offset": int(v["offset"]),
                "events": int(v["events"]),
            }
            for k, v in scores.items()
            if k.startswith("baseline_")
        }
    if "similarity_cosine" in scores:
        report["similarity"] = {
            s: {
                "cosine": scores["similarity_cosine"][s].tolist(),
                "cka": scores["similarity_cka"][s].tolist(),
            }
            for s in scores["similarity_cosine"]
        }


def _num(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def head_records(scores: dict, shapes: dict, thresholds: dict) -> list[dict]:
    """One record per (attention type, layer, head) with every metric (null when absent)."""
    rare_avg = {s: float(v.mean()) for s, v in scores.get("rare_word", {}).items()}
    baselines = {k[len("baseline_") :]: v for k, v in scores.items() if k.startswith("baseline_")}
    records = []
    for site, (layers, heads) in shapes.items():
        for i in range(layers):
            for h in range(heads):
                rec: dict = {"site": site, "layer": i, "head": h}
                for f in HEAD_FIELDS:
                    v = scores.get(f, {}).get(site)
                    rec[f] = None if v is None else _num(v[i, h])
                frac = rec["positional_fraction"]
                rec["positional"] = frac is not None and frac >= thresholds["positional"]
                rec["rare"] = (
                    rec["rare_word"] is not None
                    and rec["rare_word"] >= rare_avg[site] + thresholds["rare_margin"]
                )
                syn = {
                    name: _num(scores[f"syntax_{name}"][site][i, h])
                    for name in baselines
                    if site in scores[f"syntax_{name}"]
                }
                rec["syntax"] = syn or None
                rec["syntactic"] = [
                    n
                    for n, acc in syn.items()
                    if acc >= float(baselines[n][ENC_SELF]) + thresholds["syntactic_margin"]
                ]
                records.append(rec)
    return records


def _heatmap(path: Path, name: str, scores: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sites = list(scores)
    fig, axes = plt.subplots(1, len(sites), figsize=(4 * len(sites), 3), squeeze=False)
    for ax, site in zip(axes[0], sites):
        v = scores[site].float().numpy()  # (L, H)
        im = ax.imshow(v, cmap="viridis", aspect="auto")
        ax.set(title=site, xlabel="head", ylabel="layer")
        ax.set_xticks(range(v.shape[1]))
        ax.set_yticks(range(v.shape[0]))
        fig.colorbar(im, ax=ax)
    fig.suptitle(name)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _curve_png(path: Path, curve: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["removed"] for r in curve], [r["loss"] for r in curve], marker="o")
    ax.set(xlabel="heads removed (least important first)", ylabel="mean NLL")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def summary_markdown(report: dict, top: int = 10) -> str:
    heads = report["heads"]
    label = lambda r: f"{r['site']} L{r['layer']} H{r['head']}"  # noqa: E731
    lines = [
        f"# Head scores: {report['checkpoint']}",
        "",
        f"Data `{report['data']}`, subset `{report['subset']}`, {report['sentences']} "
        f"sentences; metrics: {', '.join(report['metrics'])}.",
        "",
        "## Positional heads",
    ]
    pos = [r for r in heads if r["positional"]]
    lines += [
        f"- {label(r)}: offset {r['positional_offset']:+.0f} in "
        f"{100 * r['positional_fraction']:.1f} % of maxima"
        for r in pos
    ] or ["- none"]
    lines += ["", "## Syntactic heads (encoder self-attention)"]
    syn = report.get("syntax")
    if syn:
        lines.append(
            f"Trees: {syn['trees']}; {syn['matched']} sentences matched, {syn['skipped']} skipped."
        )
        lines += [
            "",
            "| relation | baseline (offset) | best head | accuracy |",
            "|---|---|---|---|",
        ]
        for name, base in syn["baselines"].items():
            cand = [r for r in heads if r["syntax"] and name in r["syntax"]]
            best = max(cand, key=lambda r: r["syntax"][name])
            lines.append(
                f"| {name} | {base['accuracy']:.3f} ({base['offset']:+d}) | {label(best)} | "
                f"{best['syntax'][name]:.3f} |"
            )
        lines.append("")
        lines += [f"- {label(r)}: {', '.join(r['syntactic'])}" for r in heads if r["syntactic"]]
        lines += [] if any(r["syntactic"] for r in heads) else ["- none"]
    else:
        lines.append("- not scored (pass --conllu FILE or --parse stanza)")
    lines += ["", "## Rare-word heads"]
    for site, avg in report.get("rare_word_average", {}).items():
        lines.append(f"- average {site} head: {avg:.3f}")
    lines += [f"- {label(r)}: {r['rare_word']:.3f}" for r in heads if r["rare"]] or ["- none"]
    for field, title in (("lrp", "relevance (LRP)"), ("importance", "importance")):
        rows = [r for r in heads if r[field] is not None]
        if rows:
            lines += ["", f"## Top heads by {title}", "", "| head | value |", "|---|---|"]
            for r in sorted(rows, key=lambda r: -r[field])[:top]:
                lines.append(f"| {label(r)} | {r[field]:.4f} |")
    abl = report.get("ablation")
    if abl and abl.get("curve"):
        lines += ["", "## Greedy ablation curve", "", "| heads removed | mean NLL |", "|---|---|"]
        lines += [f"| {r['removed']} | {r['loss']:.4f} |" for r in abl["curve"]]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, report: dict, scores: dict) -> None:
    """heads.json, heads.csv, <metric>.png, ablation_curve.png, summary.md into ``out``."""
    validate(report, json.loads(SCHEMA_PATH.read_text()))
    (out / "heads.json").write_text(json.dumps(report, indent=1) + "\n")
    heads = report["heads"]
    syn_cols = sorted({k for r in heads if r["syntax"] for k in r["syntax"]})
    cols = ["site", "layer", "head", *HEAD_FIELDS, "positional", "rare", "syntactic"]
    with open(out / "heads.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols + [f"syntax_{c}" for c in syn_cols])
        for r in heads:
            syn = r["syntax"] or {}
            row = [r[c] if c != "syntactic" else " ".join(r[c]) for c in cols]
            w.writerow(row + [syn.get(c) for c in syn_cols])
    for field in HEATMAP_FIELDS:
        per_site = {s: v for s, v in scores.get(field, {}).items() if not torch.isnan(v).all()}
        if per_site:
            _heatmap(out / f"{field}.png", field, per_site)
    for name, per_site in scores.items():
        if name.startswith("syntax_"):
            _heatmap(out / f"{name}.png", name, per_site)
    if report.get("ablation") and report["ablation"].get("curve"):
        _curve_png(out / "ablation_curve.png", report["ablation"]["curve"])
    (out / "summary.md").write_text(summary_markdown(report))


@contextlib.contextmanager
def atomic_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """A temporary folder next to ``out``, renamed to ``out`` only if the block succeeds."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old"))
            out.rename(old / "x")
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def validate(value, schema: dict, path: str = "$") -> None:
    """A small JSON-schema subset: type, required, properties, additionalProperties, items,
    enum, minimum. Raises ValueError naming the first offending path."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        ok = any(
            isinstance(value, _TYPES[t])
            and not (t in ("integer", "number") and value is True)
            and not (t in ("integer", "number") and value is False)
            for t in types
        )
        if not ok:
            raise ValueError(f"{path}: expected {types}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        raise ValueError(f"{path}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                raise ValueError(f"{path}: missing required key {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, v in value.items():
            if key in props:
                validate(v, props[key], f"{path}.{key}")
            elif extra is False:
                raise ValueError(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                validate(v, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            validate(v, schema["items"], f"{path}[{i}]")
