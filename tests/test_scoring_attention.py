"""Attention statistics, syntactic accuracy and similarity on maps with known answers."""

from __future__ import annotations

import pytest
import torch

from fairseq_headprune.scoring.attention_stats import AttentionStats
from fairseq_headprune.scoring.similarity import linear_cka_matrix
from fairseq_headprune.scoring.syntax import (
    SyntaxAccuracy,
    Tree,
    parse_with_stanza,
    read_conllu,
    source_words,
)

PAD, EOS, NSPECIAL = 1, 2, 4
H, B, T = 3, 4, 7


def _stats(counts: torch.Tensor) -> AttentionStats:
    shapes = {"enc-self": (1, H)}
    return AttentionStats(shapes, PAD, EOS, {"enc-self": counts}, NSPECIAL)


def _tokens(t: int = T) -> torch.Tensor:
    torch.manual_seed(0)
    tok = torch.randint(NSPECIAL, 20, (B, t))  # (B, T)
    tok[:, -1] = EOS
    tok[0, :2] = PAD  # left padding, as fairseq's source
    return tok


def test_previous_token_head_is_positional_at_minus_one():
    t = 40  # the first token has no previous one: it attends to itself (2 of 37 queries)
    tok = _tokens(t)
    w = torch.softmax(torch.randn(H, B, t, t), -1)  # (H, B, T, S)
    w[0] = torch.diag_embed(torch.ones(t - 1), offset=-1)  # head 0: previous token
    w[0, :, 0, 0] = 1.0
    stats = _stats(torch.ones(20))
    stats.add("enc-self", 0, w, tok, tok)
    out = stats.result()
    assert out["positional_offset"]["enc-self"][0, 0] == -1
    frac = out["positional_fraction"]["enc-self"][0]
    assert frac[0] > 0.9 and (frac[1:] < 0.9).all()
    assert abs(float(out["confidence"]["enc-self"][0, 0]) - 1.0) < 1e-6
    assert float(out["entropy"]["enc-self"][0, 0]) < 1e-6


def test_rare_word_head_finds_the_least_frequent_token():
    tok = _tokens()
    counts = torch.full((20,), 100)
    rare = torch.tensor([4, 3, 0, 5])  # the rare token's position in each sentence
    for b, p in enumerate(rare.tolist()):
        tok[b, p] = 19
    tok[tok.eq(19) & ~torch.nn.functional.one_hot(rare, T).bool()] = 18
    counts[19] = 1
    counts[18] = 50
    w = torch.softmax(torch.randn(H, B, T, T), -1)
    w[1] = 0.0
    w[1, torch.arange(B), :, rare] = 1.0  # head 1 always attends to the rare token
    stats = _stats(counts)
    stats.add("enc-self", 0, w, tok, tok)
    rare_word = stats.result()["rare_word"]["enc-self"][0]
    assert rare_word[1] == 1.0 and (rare_word[[0, 2]] < 0.7).all()


def test_tree_following_head_scores_all_relations():
    tree = Tree(
        ["the", "big", "dog", "barks", "loudly"],
        [2, 2, 3, -1, 3],  # the->dog, big->dog, dog->barks, barks root, loudly->barks
        ["det", "amod", "nsubj", "root", "advmod"],
    )
    words = len(tree.words)
    word_of = torch.tensor([0, 1, 2, 2, 3, 4])  # "dog" is two subwords
    w = torch.full((1, 2, 6, 6), 1 / 6)  # (L, H, n, n) head 1 uniform
    follow = torch.zeros(words, words)
    for d, h in enumerate(tree.heads):
        follow[d, h if h >= 0 else d] = 1.0  # dependent -> head
    follow[3, 2] = 1.0  # barks -> dog (nsubj head -> dependent) wins over itself
    follow[3, 3] = 0.0
    w[0, 0] = follow[word_of][:, word_of] / torch.bincount(word_of)[word_of]  # to subwords
    scorer = SyntaxAccuracy({}, {})
    scorer.add(tree, w, word_of)
    out = scorer.result()
    for name in ("nsubj_dep2head", "amod_dep2head", "advmod_dep2head", "nsubj_head2dep"):
        assert out[f"syntax_{name}"]["enc-self"][0, 0] == 1.0, name
    assert out["baseline_amod_dep2head"]["offset"] == 1
    assert "obj_dep2head" not in out  # no event


def test_conllu_skips_multiword_tokens_and_empty_nodes_and_folds_subtypes(tmp_path):
    path = tmp_path / "x.conllu"
    rows = [
        "# text = don't go",
        "1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        "1\tdo\tdo\tAUX\t_\t_\t3\taux\t_\t_",
        "2\tn't\tnot\tPART\t_\t_\t3\tadvmod\t_\t_",
        "3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_",
        "3.1\tgo\tgo\tVERB\t_\t_\t_\t_\t3:conj\t_",
        "4\tit\tit\tPRON\t_\t_\t3\tnsubj:pass\t_\t_",
    ]
    path.write_text("\n".join(rows) + "\n\n")
    (tree,) = read_conllu(path)
    assert tree.words == ["do", "n't", "go", "it"]
    assert tree.heads == [2, 2, -1, 2] and tree.deprels[3] == "nsubj"


def test_source_words_of_sentencepiece_bpe_and_plain_tokens():
    assert source_words(["\u2581the", "\u2581do", "g"]) == (["the", "dog"], [0, 1, 1])
    assert source_words(["the", "do@@", "g"]) == (["the", "dog"], [0, 1, 1])
    assert source_words(["w3", "w17"]) == (["w3", "w17"], [0, 1])


def test_cka_is_one_for_identical_heads_and_invariant_to_rotation():
    torch.manual_seed(0)
    x = torch.randn(200, 4).double()
    q, _ = torch.linalg.qr(torch.randn(4, 4).double())
    z = torch.cat([x, 3 * x @ q, torch.randn(200, 4).double()], 1)  # (N, 3·4)
    cka = linear_cka_matrix(z.T @ z, z.sum(0), 200, 3)
    assert abs(float(cka[0, 1]) - 1) < 1e-9 and float(cka[0, 2]) < 0.2
    torch.testing.assert_close(cka, cka.T)


def test_missing_stanza_models_give_a_clear_error(monkeypatch):
    import stanza

    def no_models(*args, **kwargs):
        raise FileNotFoundError("Resources file not found")

    monkeypatch.setattr(stanza, "Pipeline", no_models)
    with pytest.raises(ValueError, match=r"stanza.download\('en'\).*--conllu"):
        parse_with_stanza([["w3", "w17"]])
