"""The bench command's FLOP model against torch's own FLOP counter, and a smoke run."""

import json
from argparse import Namespace

import torch
from torch.utils.flop_counter import FlopCounterMode

from fairseq_headprune.bench import load, make_batches, search_work, sentences
from fairseq_headprune.macs import encoder_macs
from fairseq_headprune.pruning import resize_attention
from tests.helpers import build_model, cli


def _counted_encoder_macs(model, src_len: int) -> int:
    src = torch.randint(4, 20, (1, src_len))
    with FlopCounterMode(display=False) as counter:
        model.encoder(src, src_lengths=torch.tensor([src_len]))
    return counter.get_total_flops() // 2  # a multiply-add is two FLOPs


def test_encoder_macs_match_torch_flop_counter():
    # the gated model's explicit attention route runs bmm, which the counter sees (on CPU it
    # misses the fused route's attention products)
    model, _ = build_model("gated_transformer")
    model.eval()
    assert encoder_macs(model, 7) == _counted_encoder_macs(model, 7)
    # with heads removed, including a layer with none left
    model.encoder.layers[0].self_attn = resize_attention(model.encoder.layers[0].self_attn, 1)
    model.encoder.layers[1].self_attn = resize_attention(model.encoder.layers[1].self_attn, 0)
    assert encoder_macs(model, 7) == _counted_encoder_macs(model, 7)


def test_bench_command_reports_every_measure(stock_checkpoint, tiny_data, tmp_path):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"enc-self": [[0], [1, 2]]}))
    pruned = tmp_path / "pruned.pt"
    cli("fairseq-headprune", "export", "--path", stock_checkpoint, "--out", pruned, "--mask", mask)
    out = cli(
        "fairseq-headprune", "bench", tiny_data, "--full", stock_checkpoint, "--pruned", pruned,
        "--batch-sizes", "1", "8", "--repeats", "1", "--memory", "--json-out", tmp_path / "b.json",
    ).stdout  # fmt: skip
    report = json.loads((tmp_path / "b.json").read_text())
    rows = [(r["what"], r["batch"]) for r in report["rows"]]
    measures = ["encoder forward", "generate beam 5", "decoder (beam-enc)"]
    assert rows == [(m, 1) for m in measures] + [(m, 8) for m in measures]
    assert report["heads"]["pruned"][:2] == [1, 2]
    # encoder heads only: the encoder and beam search get faster, the decoder's work stays
    assert all(r["predicted"] > 1 for r in report["rows"] if r["what"] != measures[2])
    assert all(r["predicted"] == 1 for r in report["rows"] if r["what"] == measures[2])
    assert report["mac_allowed_speedup"] > max(r["predicted"] for r in report["rows"])
    assert report["params"]["full"] - report["params"]["pruned"] == 5 * (3 * (16 * 4 + 4) + 16 * 4)
    assert report["peak_rss_bytes"]["full"] > 0
    assert "incremental decoder state" in out
    generate = [r for r in report["rows"] if r["what"] == measures[1]]
    assert all(r[f"{n}_steps"] > 0 for r in generate for n in ("full", "pruned"))
    assert "decoder steps full" in out


def test_search_work_counts_the_steps_beam_search_ran(stock_checkpoint, tiny_data):
    model, task = load(str(stock_checkpoint), str(tiny_data))
    gen = task.build_generator([model], Namespace(beam=3))
    items = sentences(task, "valid", 6)
    longest = []
    for batch in make_batches(task, "valid", items, 1):
        work = search_work(task, gen, model, [batch])
        with torch.inference_mode():
            (hypos,) = task.inference_step(gen, [model], batch)
        # one sentence: the search stops with its longest finished hypothesis, every step
        # with all beam rows; the best hypothesis is one of them
        longest.append(max(len(h["tokens"]) for h in hypos))
        assert work == {
            "tokens": len(hypos[0]["tokens"]),
            "steps": longest[-1],
            "hypothesis_steps": 3 * longest[-1],
        }
    # one batch of all: as many steps as its longest sentence, finished sentences leave
    work = search_work(task, gen, model, make_batches(task, "valid", items, len(items)))
    assert work["steps"] == max(longest)
    assert work["hypothesis_steps"] == 3 * sum(longest)
