"""LRP head-relevance pass time ÷ one plain forward+backward pass on the same batches.

The LRP pass (``fairseq_headprune.scoring.lrp``, Voita et al. 2019 §4) is one forward and one
backward per batch under frozen nonlinearities; the goal is ≤ 3× a training-style
forward+backward of the loss. Runs on a randomly initialised transformer of the size given
(default: a small transformer on CPU) with random batches.

    python benchmarks/bench_lrp.py [--layers 3 --dim 128 --heads 4 --batches 5 --repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch

from fairseq_headprune.scoring.base import ScoringModel
from fairseq_headprune.scoring.lrp import LRPRelevance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/
from tests.helpers import build_model  # noqa: E402


def batches(sm: ScoringModel, n: int, bsz: int, length: int, vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        src = torch.randint(4, vocab, (bsz, length), generator=g)  # (B, S)
        src[:, -1] = sm.eos
        prev = torch.randint(4, vocab, (bsz, length), generator=g)  # (B, T)
        prev[:, 0] = sm.eos
        target = torch.cat([prev[:, 1:], torch.full((bsz, 1), sm.eos)], 1)
        lengths = torch.full((bsz,), length)
        net = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
        out.append({"id": torch.arange(bsz), "net_input": net, "target": target})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    size = [str(a.layers), str(a.dim), str(4 * a.dim), str(a.heads)]
    flags = ["--encoder-layers", size[0], "--decoder-layers", size[0],
             "--encoder-embed-dim", size[1], "--decoder-embed-dim", size[1],
             "--encoder-ffn-embed-dim", size[2], "--decoder-ffn-embed-dim", size[2],
             "--encoder-attention-heads", size[3],
             "--decoder-attention-heads", size[3]]  # fmt: skip
    model, d = build_model("transformer", *flags, vocab=a.vocab)
    sm = ScoringModel(model, types.SimpleNamespace(source_dictionary=d, target_dictionary=d))
    data = batches(sm, a.batches, a.batch_size, a.length, len(d))

    def plain() -> None:  # the loss' forward + backward to every parameter
        for sample in data:
            loss, _ = sm.nll(sample)
            loss.backward()
        model.zero_grad(set_to_none=True)

    def lrp() -> None:
        LRPRelevance()(sm, data)

    plain(), lrp()  # warm-up
    times: dict[str, list[float]] = {"plain": [], "lrp": []}
    for _ in range(a.repeats):  # interleaved; the minimum is the least disturbed run
        for name, fn in (("plain", plain), ("lrp", lrp)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    t_plain, t_lrp = min(times["plain"]), min(times["lrp"])
    print(f"model: {a.layers}+{a.layers} layers, dim {a.dim}, {a.heads} heads; "
          f"{a.batches} batches of {a.batch_size}x{a.length} tokens, torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    print(f"plain forward+backward: {t_plain:.3f} s   LRP pass: {t_lrp:.3f} s   "
          f"ratio: {t_lrp / t_plain:.2f}x (goal <= 3x)")  # fmt: skip


if __name__ == "__main__":
    main()
