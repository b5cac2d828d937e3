"""``fairseq-headprune bench``: is the physically pruned model really faster and smaller?

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned") count heads; Michel et al. 2019 ("Are Sixteen Heads Really
Better than One?") measured +17.5% BERT throughput at 50% of heads pruned and batch ≥ 16,
and about nothing at batch 1. Fewer parameters are not speed, so this measures, for a full
and a pruned checkpoint on the same sentences in one run (passes interleaved, best of
``--repeats``):

- encoder forward sentences/s at each batch size;
- beam-search sentences/s through fairseq's own ``SequenceGenerator`` (what
  ``fairseq-generate`` runs) at each batch size, and the decoder's share of it (beam search
  minus the encoder forward on the same sentences);
- the bytes of the incremental decoder state (cached keys/values) after decoding;
- peak resident memory of a fresh process that loads the model and translates (``--memory``);

and prints next to each measured speed-up the speed-up predicted by counting multiply-adds
(heads and FFN neurons, whatever was pruned; the model is ``macs``), measured ÷ predicted,
and the largest beam-search speed-up the multiply-add model allows at all (the output layer
stays).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from argparse import Namespace

import torch

from fairseq_headprune.checkpoint_io import load_model_and_task, load_split
from fairseq_headprune.macs import predicted_speedups
from fairseq_headprune.peak_memory import peak_rss
from fairseq_headprune.sites import attention_modules

logger = logging.getLogger(__name__)


def load(path: str, data: str):
    import fairseq_headprune  # noqa: F401  (a spawned child must register the plugin too)

    return load_model_and_task(path, data)


def sentences(task, subset: str, n: int) -> list[dict]:
    """The first ``n`` sentences of ``subset`` as single-sentence samples (dataset order)."""
    load_split(task, subset)
    ds = task.dataset(subset)
    return [ds[i] for i in range(min(n, len(ds)))]


def make_batches(task, subset: str, items: list[dict], batch_size: int) -> list[dict]:
    ds = task.dataset(subset)
    return [ds.collater(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]


# ---- timing --------------------------------------------------------------------------------


def time_batches(fn, batches: list[dict]) -> float:
    """Seconds to run ``fn`` on every batch, under ``torch.inference_mode``."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            fn(batch)
    return time.perf_counter() - t0


def search_work(task, gen, model, batches: list[dict]) -> dict[str, int]:
    """What beam search did: tokens of the best hypotheses (a pruned model may translate
    shorter or longer), decoder steps (a batch runs until its last sentence is done) and
    hypothesis-steps (rows through the decoder, summed over steps)."""
    work = {"tokens": 0, "steps": 0, "hypothesis_steps": 0}

    def count(layer, args):
        work["steps"] += 1
        work["hypothesis_steps"] += args[0].shape[1]  # x: (T, B, C)

    handle = model.decoder.layers[0].register_forward_pre_hook(count)
    try:
        with torch.inference_mode():
            for b in batches:
                hypos = task.inference_step(gen, [model], b)
                work["tokens"] += sum(len(h[0]["tokens"]) for h in hypos)
    finally:
        handle.remove()
    return work


def best_of(fns: dict, batches: list[dict], repeats: int) -> dict[str, float]:
    """Best wall time of each function over ``repeats`` rounds, interleaved round by round."""
    best = {name: float("inf") for name in fns}
    for r in range(repeats):
        for name in fns if r % 2 == 0 else reversed(list(fns)):
            best[name] = min(best[name], time_batches(fns[name], batches))
    return best


def decode_steps(model, batch: dict, beam: int, steps: int) -> dict:
    """Encode ``batch``, then run ``steps`` greedy incremental decoder steps for ``beam``
    copies of each sentence (beam search's shapes without its bookkeeping); return the
    decoder's incremental state."""
    net = batch["net_input"]
    with torch.inference_mode():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        order = torch.arange(net["src_tokens"].shape[0]).repeat_interleave(beam)
        enc = model.encoder.reorder_encoder_out(enc, order)
        prev = torch.full((order.numel(), 1), model.decoder.dictionary.eos())
        state: dict = {}
        for _ in range(steps):
            out, _ = model.decoder(prev, encoder_out=enc, incremental_state=state)
            prev = torch.cat([prev, out[:, -1:].argmax(-1)], dim=1)
    return state


def incremental_state_bytes(model, batch: dict, beam: int, steps: int) -> int:
    """Bytes held by the decoder's incremental state after ``steps`` steps at ``beam``."""
    state = decode_steps(model, batch, beam, steps)
    return sum(
        v.numel() * v.element_size()
        for buf in state.values()
        for v in buf.values()
        if torch.is_tensor(v)
    )


def run_bench(args: argparse.Namespace) -> dict:
    full, task = load(args.full, args.data)
    pruned, _ = load(args.pruned, args.data)
    models = {"full": full, "pruned": pruned}
    items = sentences(task, args.subset, args.max_sentences)
    src_len = round(sum(len(i["source"]) for i in items) / len(items))
    tgt_len = round(sum(len(i["target"]) for i in items) / len(items))
    report: dict = {
        "threads": torch.get_num_threads(),
        "sentences": len(items),
        "heads": {n: [a.num_heads for _, _, a in attention_modules(m)] for n, m in models.items()},
        "params": {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
        "rows": [],
    }
    predicted = predicted_speedups(full, pruned, src_len, tgt_len, args.beam)
    report["mac_allowed_speedup"] = predicted["allowed"]
    gens = {n: task.build_generator([m], Namespace(beam=args.beam)) for n, m in models.items()}
    for bs in args.batch_sizes:
        report["rows"] += timed_rows(args, task, models, gens, items, bs, predicted)
    probe = make_batches(task, args.subset, items[: max(args.batch_sizes)], max(args.batch_sizes))[
        0
    ]
    report["incremental_state_bytes"] = {
        n: incremental_state_bytes(m, probe, args.beam, tgt_len) for n, m in models.items()
    }
    if args.memory:
        bs = max(args.batch_sizes)
        report["peak_rss_bytes"] = {
            n: peak_rss(p, args.data, args.subset, len(items), bs, args.beam)
            for n, p in (("full", args.full), ("pruned", args.pruned))
        }
    return report


def timed_rows(
    args: argparse.Namespace,
    task,
    models: dict,
    gens: dict,
    items: list[dict],
    bs: int,
    predicted: dict[str, float],
) -> list[dict]:
    """The encoder forward, beam search and decoder-share rows of one batch size."""
    batches = make_batches(task, args.subset, items, bs)

    def encode(model):
        return lambda b: model.encoder(
            b["net_input"]["src_tokens"], src_lengths=b["net_input"]["src_lengths"]
        )

    enc = best_of({n: encode(m) for n, m in models.items()}, batches, args.repeats)
    rows = [_row("encoder forward", bs, len(items), enc, predicted["encoder"])]
    n_gen = min(len(items), args.generate_sentences or len(items))
    gen_batches = make_batches(task, args.subset, items[:n_gen], bs)

    def generate(name):
        return lambda b: task.inference_step(gens[name], [models[name]], b)

    gen = best_of({n: generate(n) for n in models}, gen_batches, max(1, args.repeats - 1))
    row = _row(f"generate beam {args.beam}", bs, n_gen, gen, predicted["generate"])
    for n, m in models.items():  # output length and search work, per model
        for key, value in search_work(task, gens[n], m, gen_batches).items():
            row[f"{n}_{key}"] = value
    rows.append(row)
    # the decoder's share: beam search minus the encoder on the same sentences
    if n_gen != len(items):
        enc = best_of({n: encode(m) for n, m in models.items()}, gen_batches, args.repeats)
    dec = {n: gen[n] - enc[n] for n in models}
    if min(dec.values()) <= 0:  # only when timing noise (another load) swamps a beam search
        logger.warning(f"batch {bs}: beam search timed faster than the encoder: no decoder time")
        dec = {n: float("nan") for n in models}
    rows.append(_row("decoder (beam-enc)", bs, n_gen, dec, predicted["decoder"]))
    return rows


def _row(what: str, bs: int, n: int, times: dict, predicted: float) -> dict:
    measured = times["full"] / times["pruned"]
    return {
        "what": what,
        "batch": bs,
        "full_sent_per_s": n / times["full"],
        "pruned_sent_per_s": n / times["pruned"],
        "speedup": measured,
        "predicted": predicted,
        "measured_over_predicted": measured / predicted,
    }


def format_report(r: dict) -> str:
    lines = [
        f"{r['sentences']} sentences, {r['threads']} threads; heads per attention layer: "
        f"full {r['heads']['full']}, pruned {r['heads']['pruned']}",
        f"parameters: full {r['params']['full']:,}, pruned {r['params']['pruned']:,}",
        f"{'measure':<18}{'batch':>6}{'full sent/s':>13}{'pruned sent/s':>15}"
        f"{'speed-up':>10}{'predicted':>11}{'measured/predicted':>20}",
    ]
    for row in r["rows"]:
        ratio = row["measured_over_predicted"]
        lines.append(
            f"{row['what']:<18}{row['batch']:>6}{row['full_sent_per_s']:>13.1f}"
            f"{row['pruned_sent_per_s']:>15.1f}{row['speedup']:>9.3f}x{row['predicted']:>10.3f}x"
            f"{ratio:>20.2f}"
        )
    for row in r["rows"]:
        if "full_tokens" in row:
            # time per generated token, full ÷ pruned
            per_tok = row["speedup"] * row["pruned_tokens"] / row["full_tokens"]
            lines.append(
                f"  batch {row['batch']}: generated tokens full {row['full_tokens']}, pruned "
                f"{row['pruned_tokens']}; speed-up per generated token {per_tok:.3f}x"
            )
            if "full_steps" in row:
                lines.append(
                    f"  batch {row['batch']}: decoder steps full {row['full_steps']}, pruned "
                    f"{row['pruned_steps']}; hypothesis-steps full "
                    f"{row['full_hypothesis_steps']}, pruned {row['pruned_hypothesis_steps']}"
                )
    if "mac_allowed_speedup" in r:
        lines.append(
            "the MAC model's limit for beam search (every head and FFN neuron removed, the "
            f"output layer left): {r['mac_allowed_speedup']:.2f}x"
        )
    inc = r["incremental_state_bytes"]
    lines.append(f"incremental decoder state: full {inc['full']:,} B, pruned {inc['pruned']:,} B")
    if "peak_rss_bytes" in r:
        rss = r["peak_rss_bytes"]
        lines.append(
            f"peak RSS while translating: full {rss['full']:,} B, pruned {rss['pruned']:,} B"
        )
    return "\n".join(lines)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune bench``."""
    p.add_argument("data", help="fairseq data-bin of the models")
    p.add_argument("--full", required=True, help="the unpruned checkpoint")
    p.add_argument("--pruned", required=True, help="the exported, pruned checkpoint")
    p.add_argument("--subset", default="test", help="the sentences to time (default: test)")
    p.add_argument("--max-sentences", type=int, default=512, help="sentences to time")
    p.add_argument("--generate-sentences", type=int, default=0, help="cap for beam search (0: all)")
    p.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="sentences per batch"
    )
    p.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds; the best counts")
    p.add_argument("--memory", action="store_true", help="also measure peak RSS (subprocesses)")
    p.add_argument("--json-out", help="write the report as JSON here")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> None:
    report = run_bench(args)
    print(format_report(report))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
