"""Tables of post-training pruning (Kwon et al. 2022, "A Fast Post-Training Pruning Framework
for Transformers") from ``results/summary.csv``: the budget curve with its speed-ups, and heads
alone at equal head counts against Michel et al. 2019 ("Are Sixteen Heads Really Better than
One?") and Voita et al. 2019's gated models. Printed by ``python -m recipes.study.tables
results/summary.csv --posttrain`` / ``--heads``.
"""

from __future__ import annotations

from recipes.study.summary import FFN_KEPT, HEADS_KEPT, heads_kept


def ffn_kept(r: dict) -> int:
    """FFN neurons a summary row kept, encoder and decoder together."""
    return sum(int(r[k] or 0) for k in FFN_KEPT)


def heads_only(r: dict) -> bool:
    """Whether a summary row kept every FFN neuron (or prunes no FFN at all)."""
    return not r["ffn_total"] or ffn_kept(r) == int(r["ffn_total"])


def with_references(shown: list[dict], rows: list[dict]) -> list[dict]:
    """``shown`` and, from ``rows``, the reference row each of them is measured against (once:
    a reference shown already is not added again)."""
    references = {(r["dataset"], r["baseline"], r["reference"]) for r in shown}
    references -= {(r["dataset"], r["baseline"], r["model"]) for r in shown}
    return shown + [r for r in rows if (r["dataset"], r["baseline"], r["model"]) in references]


POSTTRAIN_HEADER = (
    "| model | setting | heads kept (enc / dec-self / dec-enc) | FFN neurons kept | parameters "
    "| speed-up predicted | measured, batch 16 / 64 | valid | test 2016 | length ratio 2016 "
    "| Δ 2016 (vs) | p |"
)


def posttrain_markdown(rows: list[dict]) -> str:
    """Post-training pruning (Kwon et al. 2022) of one baseline: each budget that prunes FFN
    neurons, without and with fine-tuning, its multiply-add-predicted and measured beam-5
    speed-up, BLEU, length (heads-only budgets: :func:`heads_markdown`)."""
    shown = [r for r in rows if r["method"] in ("posttrain", "posttrain+ft") and not heads_only(r)]
    shown = with_references(shown, rows)
    lines = [POSTTRAIN_HEADER, "|---|---|---|---|" + "---:|" * 8]
    for r in sorted(shown, key=lambda r: (r["method"], -float(r["params"] or 1e12), r["model"])):
        ffn = f"{ffn_kept(r)} / {r['ffn_total']}" if r["ffn_total"] else "all"
        params = f"{int(r['params']) / 1e6:.2f} M" if r["params"] else "–"
        measured = " / ".join(f"{float(r[k]):.2f}×" if r[k] else "–" for k in
                              ("speedup_b16", "speedup_b64"))  # fmt: skip
        predicted = f"{float(r['speedup_predicted']):.2f}×" if r["speedup_predicted"] else "–"
        delta = f"{r['delta_test_2016_flickr']} ({r['reference']})" if r["reference"] else "–"
        cells = [
            r["model"], r["setting"], heads_kept(r), ffn, params, predicted, measured,
            *(f"{float(r[s]):.2f}" if r[s] else "–" for s in ("valid", "test_2016_flickr")),
            r["len_ratio_test_2016_flickr"] or "–", delta,
            r["p_test_2016_flickr"] or "–",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADS_HEADER = (
    "| heads kept (enc / dec-self / dec-enc) | model | method | setting | valid | test 2016 "
    "| test 2017 | mscoco | Δ 2016 (vs) | p |"
)
HEAD_METHODS = ("target-heads", "voita", "two-phase", "posttrain", "michel", "posttrain+ft")


def heads_markdown(rows: list[dict]) -> str:
    """Heads only, at equal head counts, on each baseline that has post-training pruned rows:
    Kwon et al.'s Fisher search (``prune --budget heads:K``), Michel et al.'s iterative
    importance and the gated models, without and with fine-tuning, and their references."""
    baselines = {(r["dataset"], r["baseline"]) for r in rows if r["method"] == "posttrain"}
    shown = [
        r
        for r in rows
        if (r["dataset"], r["baseline"]) in baselines
        and r["method"] in HEAD_METHODS
        and heads_only(r)
    ]
    shown = with_references(shown, rows)
    lines = [HEADS_HEADER, "|---|---|---|---|" + "---:|" * 6]

    def order(r: dict) -> tuple:
        kept = [-int(r[k] or 0) for k in HEADS_KEPT]
        method = HEAD_METHODS.index(r["method"]) if r["method"] in HEAD_METHODS else -1
        trained = bool(r["seed"])  # fine-tuned after pruning: after the rows without
        return (r["dataset"], r["baseline"], sum(kept), kept, trained, method, r["model"])

    for r in sorted(shown, key=order):
        delta = f"{r['delta_test_2016_flickr']} ({r['reference']})" if r["reference"] else "–"
        cells = [
            heads_kept(r), r["model"], r["method"], r["setting"],
            *(f"{float(r[s]):.2f}" if r[s] else "–" for s in
              ("valid", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")),
            delta, r["p_test_2016_flickr"] or "–",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
