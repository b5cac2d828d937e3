"""Single-head ablation: one full pass per head vs the replaying pass, on the same batches.

The single-head ablation of Michel et al. 2019 ("Are Sixteen Heads Really Better than One?",
NeurIPS 2019), used in the head analysis of Voita et al. 2019 ("Analyzing Multi-Head
Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019):
Δ mean NLL when only one head's gate is 0. ``old``: one full teacher-forced pass over all
batches per head (gate masked, full forward). ``new``:
``fairseq_headprune.scoring.importance.single_head_ablation``, which replays per batch the
encoder and layer outputs that the ablated head cannot change. Both run on the same
materialised batches; the script checks that the two give the same numbers and prints both
times and old ÷ new.

    python benchmarks/bench_ablation.py --path CKPT --data DATA_BIN [--max-sentences 200]
    python benchmarks/bench_ablation.py      # a random 6+3-layer 256-dim model, random batches
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch

from fairseq_headprune.scoring.base import Batches, ScoringModel
from fairseq_headprune.scoring.importance import full_pass_ablation, single_head_ablation


def random_setup(n: int, bsz: int = 32, length: int = 16) -> tuple[ScoringModel, list[dict]]:
    """Multi30k-baseline-sized random model (6+3 layers, 8 heads, 256-dim, 8k vocabulary)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/
    from tests.helpers import build_model

    flags = ["--encoder-layers", "6", "--decoder-layers", "3",
             "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
             "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
             "--encoder-attention-heads", "8", "--decoder-attention-heads", "8"]  # fmt: skip
    torch.manual_seed(0)
    model, d = build_model("transformer", *flags, vocab=8000)
    sm = ScoringModel(model, types.SimpleNamespace(source_dictionary=d, target_dictionary=d))
    g = torch.Generator().manual_seed(0)
    out = []
    for start in range(0, n, bsz):
        b = min(bsz, n - start)
        src = torch.randint(4, len(d), (b, length), generator=g)  # (B, S)
        src[:, -1] = sm.eos
        prev = torch.randint(4, len(d), (b, length), generator=g)  # (B, T)
        prev[:, 0] = sm.eos
        target = torch.cat([prev[:, 1:], torch.full((b, 1), sm.eos)], 1)
        net = {"src_tokens": src, "src_lengths": torch.full((b,), length),
               "prev_output_tokens": prev}  # fmt: skip
        out.append({"id": torch.arange(b), "net_input": net, "target": target})
    return sm, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", help="a transformer checkpoint (default: a random model)")
    p.add_argument("--data", help="its fairseq data-bin (with --path)")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args()
    if bool(a.path) != bool(a.data):
        p.error("--path and --data go together")
    if a.path:
        from fairseq_headprune.scoring.command import load

        model, task = load(a.data, a.path)
        sm = ScoringModel(model, task)
        data = list(Batches(task, a.subset, a.max_sentences, a.batch_size))  # materialised once
        what = f"{a.path} on the first {sum(len(s['id']) for s in data)} sentences of {a.subset}"
    else:
        sm, data = random_setup(a.max_sentences, a.batch_size)
        what = f"random 6+3-layer model, {a.max_sentences} random sentences"
    heads = sum(sm.shape(s)[0] * sm.shape(s)[1] for s in sm.sites)
    ntok = sum(int(s["target"].ne(sm.pad).sum()) for s in data)
    print(f"{what}: {len(data)} batches, {ntok} target tokens, {heads} heads "
          f"({', '.join(f'{s} {sm.shape(s)[0]}x{sm.shape(s)[1]}' for s in sm.sites)}), "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    sm.mean_loss(data[:1])  # warm-up
    t0 = time.perf_counter()
    old = full_pass_ablation(sm, data)
    t_old = time.perf_counter() - t0
    t0 = time.perf_counter()
    new = single_head_ablation(sm, data)
    t_new = time.perf_counter() - t0
    same = old[0] == new[0] and all(torch.equal(old[1][s], new[1][s]) for s in sm.sites)
    diff = max(float((old[1][s] - new[1][s]).abs().max()) for s in sm.sites)
    print(f"old (one full pass per head): {t_old:.1f} s   new (replaying): {t_new:.1f} s   "
          f"old / new: {t_old / t_new:.2f}x")  # fmt: skip
    print(f"same results: {same} (base loss {new[0]:.6f}, max |Δ old − Δ new| {diff:.3g})")
    if not same:
        raise SystemExit("the two ablations differ")


if __name__ == "__main__":
    main()
