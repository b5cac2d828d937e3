"""Training-step cost of the head gates: stock ``transformer`` vs ``gated_transformer``.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned") fine-tune with a gate on every head. The gates force
fairseq's explicit attention route (the fused one has no per-head tensor); this measures what
that costs. Both models (same shape, same weights) train side by side on the same batches:
each round runs one optimizer step of each, alternating which goes first, and the script
prints target words/s of each and the ratio gated ÷ stock step time (goal ≤ 1.05).

    python benchmarks/bench_gate_overhead.py [--data DATA_BIN] [--steps 30]

Without ``--data`` it uses a synthetic batch stream of Multi30k's shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from fairseq import options
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.tasks.translation import TranslationTask

import fairseq_headprune  # noqa: F401
from fairseq_headprune.l0_criterion import LabelSmoothedCrossEntropyL0Criterion

ARCH = [
    "--encoder-layers", "6", "--decoder-layers", "3", "--encoder-attention-heads", "8",
    "--decoder-attention-heads", "8", "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
    "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
    "--share-all-embeddings", "--dropout", "0.3", "--attention-dropout", "0.1",
]  # fmt: skip


def build(arch: str, data: str | None):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data or "/nonexistent", "--arch", arch, "--task", "translation", *ARCH]
    )
    if data:
        task = TranslationTask.setup_task(args)
    else:
        d = Dictionary()
        for i in range(8000):
            d.add_symbol(f"w{i}")
        task = TranslationTask(args, d, d)
    return task.build_model(args), task


def batches(task, data: str | None, n: int, max_tokens: int = 4096) -> list[dict]:
    if data:
        task.load_dataset("train")
        itr = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=1)
        it = itr.next_epoch_itr(shuffle=True)
        return [next(it) for _ in range(n)]
    d = task.source_dictionary
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):  # ~220 sentence pairs of ~16 tokens: one 4096-token batch
        lens = torch.randint(10, 22, (220,), generator=g)
        sents = [torch.randint(d.nspecial, len(d), (int(k),), generator=g) for k in lens]
        sents = [torch.cat([s, torch.tensor([d.eos()])]) for s in sents]
        ds = LanguagePairDataset(
            sents, [len(s) for s in sents], d, sents, [len(s) for s in sents], d
        )
        out.append(ds.collater([ds[i] for i in range(len(sents))]))
    return out


def step(model, criterion, optimizer, sample) -> float:
    t0 = time.perf_counter()
    optimizer.zero_grad()
    loss, sample_size, _ = criterion(model, sample)
    (loss / sample_size).backward()
    optimizer.step()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", help="a fairseq data-bin (default: synthetic batches)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per model")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(1)
    stock, task = build("transformer", args.data)
    gated, _ = build("gated_transformer", args.data)
    gated.load_state_dict(stock.state_dict(), strict=True)  # gates created open
    crit_stock = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    crit_gated = LabelSmoothedCrossEntropyL0Criterion(task, False, 0.1, l0_lambda=0.01)
    runs = {
        "stock": (stock, crit_stock, torch.optim.Adam(stock.parameters(), lr=1e-4)),
        "gated": (gated, crit_gated, torch.optim.Adam(gated.parameters(), lr=1e-4)),
    }
    data = batches(task, args.data, args.steps + args.warmup)
    words = sum(b["ntokens"] for b in data[args.warmup :])
    times: dict[str, list[float]] = {"stock": [], "gated": []}
    for i, sample in enumerate(data):
        order = ["stock", "gated"] if i % 2 == 0 else ["gated", "stock"]
        for name in order:
            model, crit, opt = runs[name]
            model.train()
            t = step(model, crit, opt, sample)
            if i >= args.warmup:
                times[name].append(t)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.steps} steps")
    for name, ts in times.items():
        wps, median = words / sum(ts), statistics.median(ts)
        print(f"{name:6s} {wps:9.0f} target words/s   median step {median:.3f} s")
    ratio = sum(times["gated"]) / sum(times["stock"])
    med = statistics.median(g / s for g, s in zip(times["gated"], times["stock"]))
    print(f"gated / stock step time: {ratio:.3f} (total)   {med:.3f} (median of per-batch ratios)")


if __name__ == "__main__":
    main()
