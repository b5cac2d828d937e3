"""The real fairseq entry points with ``--user-dir``: stock training → gated pruning with a
frozen decoder → validate → generate → ``fairseq-headprune gates``."""

import copy
import json
import re

import pytest
import torch

from fairseq_headprune.gated_attention import head_gates
from tests.helpers import (
    REPO,
    TINY_ARCH,
    TRAIN_COMMON,
    USER_DIR,
    cli,
    load_model,
    load_state,
    train,
)

PRUNE = [
    "--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1",
    "--freeze-decoder", "--head-gates", "enc-self", "--head-gate-lr-scale", "20",
    "--best-checkpoint-metric", "nll_loss",
]  # fmt: skip


@pytest.fixture(scope="module")
def pruned(stock_checkpoint, tiny_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("pruned")
    ckpt = train(
        tiny_data, save, *PRUNE, "--l0-lambda", "2.0", "--max-epoch", "8",
        "--finetune-from-model", stock_checkpoint, arch="gated_transformer",
    )  # fmt: skip
    return ckpt


def test_frozen_decoder_is_bit_identical_and_encoder_changed(stock_checkpoint, pruned):
    stock, gated = load_state(stock_checkpoint)["model"], load_state(pruned)["model"]
    decoder = [k for k in stock if k.startswith("decoder.")]
    encoder = [k for k in stock if k.startswith("encoder.layers.")]
    assert decoder and encoder
    for k in decoder:
        assert torch.equal(stock[k], gated[k]), k
    # the token embeddings are shared with the decoder, so they are frozen too
    assert torch.equal(stock["encoder.embed_tokens.weight"], gated["encoder.embed_tokens.weight"])
    assert sum(not torch.equal(stock[k], gated[k]) for k in encoder) > len(encoder) // 2
    assert not any(k.startswith("decoder.") and "head_gate" in k for k in gated)


def test_large_lambda_closes_encoder_heads(pruned):
    table = json.loads(cli("fairseq-headprune", "gates", pruned, "--json").stdout)
    assert list(table["sites"]) == ["enc-self"]
    enc = table["sites"]["enc-self"]
    assert enc["total"] == 8
    assert enc["open"] < 8
    opened = sum(g > 0 for layer in enc["gate"] for g in layer)
    assert opened == enc["open"]
    proc = cli("fairseq-headprune", "gates", pruned)
    assert f"enc-self: {enc['open']}/8 heads open" in proc.stdout
    assert "tensorboardX" not in proc.stderr  # fairseq's import-time hint stays out


def test_validate_and_generate_every_sentence(pruned, tiny_data):
    out = cli(
        "fairseq-validate", tiny_data, "--user-dir", USER_DIR, "--task", "translation",
        "--path", pruned, "--cpu", "--max-tokens", "500",
        "--criterion", "label_smoothed_cross_entropy_l0",
    )  # fmt: skip
    assert re.search(r"open_enc_self \d", out.stdout + out.stderr)
    gen = cli(
        "fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", pruned, "--cpu",
        "--beam", "4", "--batch-size", "8", "--required-batch-size-multiple", "1",
    )  # fmt: skip
    hyps = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 24  # every test sentence


def _valid_nll(model, task):
    """Token-mean nll of the valid set, computed here from the model's log-probs."""
    model.eval()
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=500).next_epoch_itr(
        shuffle=False
    )
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in itr:
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            mask = target.ne(task.target_dictionary.pad())
            total -= lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum().item()
            count += mask.sum().item()
    return total / count


def test_stock_checkpoint_in_gated_model_with_open_gates_has_same_nll(stock_checkpoint, tiny_data):
    stock, task = load_model(stock_checkpoint, tiny_data)
    state = load_state(stock_checkpoint)
    args = copy.copy(state["cfg"]["model"])
    args._name = args.arch = "gated_transformer"
    gated = task.build_model(args)
    gated.load_state_dict(state["model"], strict=True)  # the --finetune-from-model path
    assert len(list(head_gates(gated))) == 2 + 2 + 2
    assert abs(_valid_nll(gated, task) - _valid_nll(stock, task)) < 1e-4


def test_restore_file_with_resets_then_resume_then_refuse_other_gates(
    stock_checkpoint, tiny_data, tmp_path
):
    # --restore-file from a stock checkpoint with all --reset-* flags (runs of 10 and 20
    # updates, too short for a gate to close: acknowledged with --allow-slow-gates)
    ckpt = train(
        tiny_data, tmp_path, *PRUNE, "--l0-lambda", "0.5", "--max-epoch", "1", "--allow-slow-gates",
        "--restore-file", stock_checkpoint, "--reset-optimizer", "--reset-dataloader",
        "--reset-meters", "--reset-lr-scheduler", arch="gated_transformer",
    )  # fmt: skip
    state = load_state(ckpt)
    assert any(k.endswith("head_gate.theta") for k in state["model"])
    updates = state["optimizer_history"][-1]["num_updates"]
    # plain resume of the gated run (checkpoint_last.pt, optimizer state included)
    train(
        tiny_data,
        tmp_path,
        *PRUNE,
        "--l0-lambda",
        "0.5",
        "--max-epoch",
        "2",
        "--allow-slow-gates",
        arch="gated_transformer",
    )
    assert load_state(ckpt)["optimizer_history"][-1]["num_updates"] == 2 * updates
    before = ckpt.read_bytes()
    # resuming with other gates fails clearly and leaves checkpoint_last.pt untouched
    proc = cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--save-dir", tmp_path, *PRUNE[:-2], "--l0-lambda", "0.5",
        "--head-gates", "enc-self,dec-enc", "--max-epoch", "3", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "trained with --head-gates enc-self" in proc.stderr.strip().splitlines()[-1]
    assert ckpt.read_bytes() == before


BAD_INPUT = [
    (["--head-gates", "enc-self,cross"], "--head-gates: unknown attention type"),
    (["--l0-lambda", "-1"], "--l0-lambda -1.0: must be a number >= 0"),
    (["--head-gate-temperature", "0"], "--head-gate-temperature 0.0: must be a number > 0"),
    (["--head-gate-stretch-low", "0.1"], "--head-gate-stretch-low 0.1: must be a number < 0"),
    (["--freeze-decoder", "--head-gates", "dec-enc"], "puts no gate on enc-self"),
    (["--encoder-ffn-embed-dim", "48"], "other dimensions"),
]


@pytest.mark.parametrize("extra, message", BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_names_the_flag(extra, message, stock_checkpoint, tiny_data, tmp_path):
    proc = cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--save-dir", tmp_path, "--max-epoch", "1",
        "--criterion", "label_smoothed_cross_entropy_l0", "--finetune-from-model",
        stock_checkpoint, *extra, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last  # the plugin's line, last
    assert not list(tmp_path.iterdir())  # no crash.pt, no checkpoint


def test_gates_command_rejects_a_stock_checkpoint(stock_checkpoint):
    proc = cli("fairseq-headprune", "gates", stock_checkpoint, check=False)
    assert proc.returncode != 0 and "has no head gates" in proc.stderr


@pytest.mark.parametrize("launch", ["ddp2", "update_freq2"])
def test_distributed_and_update_freq_log_the_same_metrics(
    launch, stock_checkpoint, tiny_data, tmp_path
):
    args = [
        tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer", *TINY_ARCH,
        *TRAIN_COMMON, *PRUNE, "--l0-lambda", "1.0", "--max-epoch", "2",
        "--finetune-from-model", stock_checkpoint,
        "--allow-slow-gates",  # 10 to 20 updates: logging is tested, not closing gates
    ]  # fmt: skip
    single = cli("fairseq-train", *args, "--save-dir", tmp_path / "one")
    if launch == "ddp2":
        multi = cli(
            "bash",
            REPO / "scripts" / "train_cpu_ddp.sh",
            "2",
            *args,
            "--save-dir",
            tmp_path / "two",
        )
    else:
        multi = cli("fairseq-train", *args, "--update-freq", "2", "--save-dir", tmp_path / "two")

    def valid_metrics(proc):
        line = [x for x in (proc.stdout + proc.stderr).splitlines() if "| valid on 'valid'" in x][
            -1
        ]
        return dict(re.findall(r"\| (\w+) ([-\d.]+)", line))

    one, two = valid_metrics(single), valid_metrics(multi)
    for key in ("nll_loss", "l0_penalty", "exp_open_enc_self", "open_enc_self"):
        assert key in one and key in two
    assert float(two["open_enc_self"]) <= 8 and float(two["exp_open_enc_self"]) < 8
    assert (tmp_path / "two" / "checkpoint_last.pt").exists()
