"""``--target-heads``: the budget controller (``budget``), its criterion, and real fairseq-train
runs that end with exactly K open heads, also across a resume."""

import json

import pytest
import torch

from fairseq_headprune import budget
from fairseq_headprune.gated_attention import head_gates
from fairseq_headprune.hard_concrete import GRAD_SCALE
from fairseq_headprune.l0_criterion import LabelSmoothedCrossEntropyL0Criterion
from fairseq_headprune.sites import SITES
from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, build_model, cli, load_state, train
from tests.test_l0_criterion import _samples, _Task

# ---------------------------------------------------------------- spec parsing and checks


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("10", {"total": 10}),
        (" 0 ", {"total": 0}),
        ("dec-enc:20,enc-self:10", {"enc-self": 10, "dec-enc": 20}),
        ("enc-self:3", {"enc-self": 3}),
    ],
)
def test_parse_target_heads(spec, expected):
    parsed = budget.parse_target_heads(spec, SITES)
    assert parsed == expected and list(parsed) == list(expected)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("-1", "must be >= 0"),
        ("enc-self:-2", "must be >= 0"),
        ("cross:3", "unknown attention type 'cross'"),
        ("enc-self:x", "not a whole number"),
        ("enc-self:2,enc-self:3", "more than once"),
        ("5,enc-self:3", "not both"),
        ("", "empty budget"),
    ],
)
def test_parse_target_heads_rejects(spec, message):
    with pytest.raises(ValueError, match="--target-heads") as e:
        budget.parse_target_heads(spec, SITES)
    assert message in str(e.value)


def test_check_targets():
    heads = {"enc-self": 8, "dec-enc": 8}
    budget.check_targets({"total": 16}, heads)
    budget.check_targets({"enc-self": 8, "dec-enc": 0}, heads)
    with pytest.raises(ValueError, match="--target-heads: 9 heads wanted for enc-self, but it"):
        budget.check_targets({"enc-self": 9}, heads)
    with pytest.raises(ValueError, match="17 heads wanted for total"):
        budget.check_targets({"total": 17}, heads)
    with pytest.raises(ValueError, match="a budget for dec-self, but its heads have no gate"):
        budget.check_targets({"dec-self": 1}, heads)


def test_ramped_target():
    start, goal = torch.tensor([8.0, 16.0]), torch.tensor([2.0, 4.0])
    for updates, expected in (
        (0, [8.0, 16.0]),
        (50, [5.0, 10.0]),
        (100, [2.0, 4.0]),
        (500, [2, 4]),
    ):
        got = budget.ramped_target(start, goal, updates, 100)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float))
    torch.testing.assert_close(budget.ramped_target(start, goal, 0, 0), goal)


# ---------------------------------------------------------------- the controller


def _controller_step(logits, lambdas, target, optimizer):
    """One step of Adam descent on everything, as fairseq's single optimiser does."""
    optimizer.zero_grad()
    lam1, lam2 = (budget.gradient_ascent(p) for p in lambdas)
    expected = torch.sigmoid(logits).sum().reshape(1)  # (1,)
    budget.lagrangian_term(expected, torch.tensor([target]), lam1, lam2).backward()
    optimizer.step()
    return expected.item()


@pytest.mark.parametrize("start_logit, target, sign", [(2.0, 3.0, +1), (-2.0, 6.0, -1)])
def test_multipliers_ascend_and_push_the_count_toward_k(start_logit, target, sign):
    """ŝ > K: λ₁ rises and P(open) falls; ŝ < K: λ₁ falls below 0 and P(open) rises."""
    logits = torch.full((8,), start_logit, requires_grad=True)
    lambdas = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    optimizer = torch.optim.Adam([logits, *lambdas], lr=0.05)
    s0 = torch.sigmoid(logits).sum().item()
    assert sign * (s0 - target) > 0
    _controller_step(logits, lambdas, target, optimizer)
    # ascent: ∂L/∂λ₁ = ŝ − K, ∂L/∂λ₂ = (ŝ − K)² ≥ 0
    assert sign * lambdas[0].item() > 0 and lambdas[1].item() > 0
    for _ in range(5):
        _controller_step(logits, lambdas, target, optimizer)
    assert sign * (torch.sigmoid(logits).sum().item() - s0) < 0  # moved toward K
    for _ in range(3000):
        s = _controller_step(logits, lambdas, target, optimizer)
    assert s == pytest.approx(target, abs=0.05)  # and settles on it


def test_gradient_ascent_negates_only_the_gradient():
    p = torch.tensor([2.0], requires_grad=True)
    out = budget.gradient_ascent(p)
    assert torch.equal(out, p)
    (3 * out).sum().backward()
    assert p.grad.item() == pytest.approx(-3.0 * GRAD_SCALE)  # negated, scaled like a gate's
    with torch.no_grad():  # validation: no hook, no error
        budget.gradient_ascent(p)


def test_rounding_term_opens_the_top_k_and_closes_the_rest():
    logits = torch.tensor([[0.5, -0.2, 0.1, 0.0]], requires_grad=True)
    budget.rounding_term({"enc-self": torch.sigmoid(logits)}, {"total": 2}).backward()
    assert (logits.grad[0, [0, 2]] < 0).all() and (logits.grad[0, [1, 3]] > 0).all()


# ---------------------------------------------------------------- top-K at export


def test_topk_open_mask_is_exact_per_type_and_in_total():
    g = torch.Generator().manual_seed(0)
    prob = {s: torch.rand(3, 4, generator=g) for s in SITES}
    for k in range(0, 37, 5):
        mask = budget.topk_open_mask(prob, {"total": k})
        assert sum(m.sum().item() for m in mask.values()) == k
        kept = torch.cat([prob[s][mask[s]] for s in SITES])
        dropped = torch.cat([prob[s][~mask[s]] for s in SITES])
        if k and dropped.numel():
            assert kept.min() >= dropped.max()
    mask = budget.topk_open_mask(prob, {"enc-self": 5, "dec-enc": 0})
    assert mask["enc-self"].sum() == 5 and mask["dec-enc"].sum() == 0
    assert mask["dec-self"].all()  # no budget: kept
    assert torch.equal(
        mask["enc-self"], prob["enc-self"] >= prob["enc-self"].flatten().topk(5)[0][-1]
    )
    # ties: exactly K all the same, the earlier heads first
    tied = budget.topk_open_mask({"enc-self": torch.full((2, 4), 0.5)}, {"enc-self": 3})
    assert tied["enc-self"].tolist() == [[True, True, True, False], [False] * 4]
    with pytest.raises(ValueError, match="--target-heads"):
        budget.topk_open_mask(prob, {"total": 37})


# ---------------------------------------------------------------- the criterion


def _criterion(d, **kw):
    return LabelSmoothedCrossEntropyL0Criterion(
        _Task(d), sentence_avg=False, label_smoothing=0.1, **kw
    )


def test_criterion_multipliers_are_parameters_with_ascent_gradients():
    model, d = build_model("gated_transformer", "--head-gates", "enc-self,dec-enc")
    model.eval()
    model.num_updates = 25
    crit = _criterion(
        d, target_heads="enc-self:2,dec-enc:6", target_heads_warmup_updates=100,
        target_heads_lr_scale=10.0, target_heads_rounding=0.0,
    )  # fmt: skip
    assert [n for n, _ in crit.named_parameters()] == ["lambda_1", "lambda_2"]
    whole, halves = _samples(d)
    total = 0
    for sample in halves:  # two micro-batches: fairseq divides by the summed sample size
        loss, sample_size, log = crit(model, sample)
        loss.backward()
        total += sample_size
    with torch.no_grad():
        s_hat = torch.stack([g.prob_open().sum() for _, _, g in head_gates(model)]).view(2, 2)
    s_hat = s_hat.sum(1)  # (enc-self, dec-enc)
    target = torch.tensor([8 - 6 * 0.25, 8 - 2 * 0.25])
    # ∂L/∂λ₁ = scale·(ŝ − t), negated by the ascent hook
    ascent = -10 * GRAD_SCALE
    torch.testing.assert_close(crit.lambda_1.grad / total, ascent * (s_hat - target))
    torch.testing.assert_close(crit.lambda_2.grad / total, ascent * (s_hat - target) ** 2)
    assert log["target_enc_self"] / sample_size == pytest.approx(6.5)
    assert log["target_dec_enc"] / sample_size == pytest.approx(7.5)
    assert {"lambda_1_enc_self", "lambda_2_dec_enc", "exp_open_dec_enc"} <= set(log)


def test_criterion_rejects_lambda_with_target_heads_and_bad_budgets():
    model, d = build_model("gated_transformer", "--head-gates", "enc-self")
    with pytest.raises(ValueError, match="--target-heads 3 and --l0-lambda 0.5 both set"):
        _criterion(d, l0_lambda=0.5, target_heads="3")
    whole, _ = _samples(d)
    with pytest.raises(ValueError, match="--target-heads: 9 heads wanted for total"):
        _criterion(d, target_heads="9")(model, whole)
    with pytest.raises(ValueError, match="--target-heads: a budget for dec-enc, but its heads"):
        _criterion(d, target_heads="dec-enc:2")(model, whole)


def test_criterion_without_target_heads_has_no_parameters():
    _, d = build_model()
    assert not list(_criterion(d, l0_lambda=0.5).parameters())


# ---------------------------------------------------------------- real fairseq-train runs

BUDGET = [
    "--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1",
    "--freeze-decoder", "--head-gates", "enc-self", "--head-gate-lr-scale", "20",
    "--best-checkpoint-metric", "nll_loss", "--target-heads-warmup-updates", "50",
]  # fmt: skip
EPOCHS = 15  # 10 updates an epoch: 50 of warm-up, 100 at K


def _run(tiny_data, save, stock, k, epochs):
    return train(
        tiny_data, save, *BUDGET, "--target-heads", str(k), "--max-epoch", str(epochs),
        "--finetune-from-model", stock, arch="gated_transformer",
    )  # fmt: skip


def _open_heads(ckpt) -> int:
    table = json.loads(cli("fairseq-headprune", "gates", ckpt, "--json").stdout)
    enc = table["sites"]["enc-self"]
    # the deterministic gates keep the same heads as the export's top-K choice
    prob = {"enc-self": torch.tensor(enc["prob_open"])}
    keep = budget.topk_open_mask(prob, {"enc-self": enc["open"]})["enc-self"]
    assert keep.tolist() == [[g > 0 for g in layer] for layer in enc["gate"]]
    return enc["open"]


@pytest.fixture(scope="module")
def k3_run(tiny_data, stock_checkpoint, tmp_path_factory):
    """An uninterrupted --target-heads 3 run (the resume test compares against it)."""
    return _run(tiny_data, tmp_path_factory.mktemp("k3"), stock_checkpoint, 3, EPOCHS)


def test_fairseq_train_ends_with_exactly_k_open_heads(
    k3_run, tiny_data, stock_checkpoint, tmp_path
):
    ckpt6 = _run(tiny_data, tmp_path, stock_checkpoint, 6, EPOCHS)
    for k, ckpt in ((3, k3_run), (6, ckpt6)):
        assert _open_heads(ckpt) == k
        state = load_state(ckpt)
        assert set(state["criterion"]) == {"lambda_1", "lambda_2"}  # saved with the model
        assert state["criterion"]["lambda_2"].item() > 0


def test_resume_restores_the_multipliers_and_reaches_k(
    k3_run, tiny_data, stock_checkpoint, tmp_path
):
    mid = load_state(_run(tiny_data, tmp_path, stock_checkpoint, 3, 8))
    assert (mid["criterion"]["lambda_2"] > 0).all()  # trained and saved mid-run
    # the same command with a larger --max-epoch resumes from checkpoint_last.pt
    ckpt = _run(tiny_data, tmp_path, stock_checkpoint, 3, EPOCHS)
    state = load_state(ckpt)
    assert state["optimizer_history"][-1]["num_updates"] == 10 * EPOCHS
    assert _open_heads(ckpt) == 3
    # resumed == uninterrupted (fairseq reseeds every update): λ was restored, not reset to 0
    reference = load_state(k3_run)["criterion"]
    for name, value in reference.items():
        torch.testing.assert_close(state["criterion"][name], value, rtol=1e-3, atol=1e-4)


BAD_INPUT = [
    (["--target-heads", "9"], "--target-heads: 9 heads wanted for total, but it has only 8"),
    (["--target-heads", "-1"], "--target-heads: the number of heads must be >= 0"),
    (["--target-heads", "dec-enc:2"], "--target-heads: a budget for dec-enc, but its heads"),
    (["--target-heads", "3", "--l0-lambda", "0.5"], "--target-heads 3 and --l0-lambda 0.5"),
]


@pytest.mark.parametrize("extra, message", BAD_INPUT, ids=[m[:40] for _, m in BAD_INPUT])
def test_bad_budget_names_the_flag(extra, message, stock_checkpoint, tiny_data, tmp_path):
    proc = cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--save-dir", tmp_path, "--max-epoch", str(EPOCHS),
        *BUDGET, "--finetune-from-model", stock_checkpoint, *extra, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "checkpoint_last.pt").exists()
