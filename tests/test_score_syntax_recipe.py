"""``recipes/score_syntax.sh`` end to end: gold trees → source text → SentencePiece →
fairseq-preprocess with the model's dictionaries → ``fairseq-headprune score --conllu``.

The syntactic heads of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, §5.2) on a made-up treebank
with a multiword token, an empty node and one sentence that cannot be aligned (a character
the SentencePiece model never saw becomes ``<unk>`` inside a word), scored with a tiny
transformer trained for a few updates on the treebank's own text.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fairseq_headprune.scoring.outputs import SCHEMA_PATH, validate
from tests.helpers import BIN, REPO, preprocess, train

NOUNS = ("dog", "cat", "man", "woman", "child", "bird")
ADJS = ("big", "red", "small", "old")
OBJS = ("apple", "ball", "bread", "toy")


def _rows(words: list[tuple[str, int, str]]) -> list[str]:
    return [f"{i}\t{w}\t{w}\tX\t_\t_\t{h}\t{r}\t_\t_" for i, (w, h, r) in enumerate(words, 1)]


def treebank() -> tuple[str, list[list[str]], int]:
    """CoNLL-U text, each sentence's words (multiword tokens and empty nodes skipped), and the
    index of the sentence with a character that only it contains ("ü")."""
    blocks, words = [], []
    for i in range(12):
        n, a, o = NOUNS[i % 6], ADJS[i % 4], OBJS[i % 4]
        if i % 3 == 0:  # The big dog quickly ate the red apple .
            sent = [("The", 3, "det"), (a, 3, "amod"), (n, 5, "nsubj"), ("quickly", 5, "advmod"),
                    ("ate", 0, "root"), ("the", 8, "det"), ("red", 8, "amod"), (o, 5, "obj"),
                    (".", 5, "punct")]  # fmt: skip
            rows = _rows(sent)
        elif i % 3 == 1:  # I don't like cold tea . — "don't" a multiword token, plus an empty node
            sent = [("I", 4, "nsubj"), ("do", 4, "aux"), ("n't", 4, "advmod"), ("like", 0, "root"),
                    (a, 6, "amod"), (o, 4, "obj:pass"), (".", 4, "punct")]  # fmt: skip
            rows = _rows(sent)
            rows.insert(1, "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_")
            rows.insert(5, "4.1\tlike\tlike\tX\t_\t_\t_\t_\t4:conj\t_")
        else:  # the dog sees a small ball
            sent = [("the", 2, "det"), (n, 3, "nsubj"), ("sees", 0, "root"), ("a", 6, "det"),
                    (a, 6, "amod"), (o, 3, "obj")]  # fmt: skip
            rows = _rows(sent)
        if i == 5:  # the only "ü": unknown to the SentencePiece model, so <unk> inside a word
            sent[1] = ("Zürich", 3, "nsubj")
            rows = _rows(sent)
        blocks.append("\n".join([f"# sent_id = s{i}", *rows]))
        words.append([w for w, _, _ in sent])
    return "\n\n".join(blocks) + "\n\n", words, 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """A treebank, a SentencePiece model and a tiny transformer trained on its text."""
    root = tmp_path_factory.mktemp("syntax")
    conllu, words, odd = treebank()
    ud = root / "ud"
    ud.mkdir()
    (ud / "en_ewt-ud-test.conllu").write_text(conllu)
    text = root / "text.txt"  # the SentencePiece training text never contains "ü"
    text.write_text("".join(" ".join(w) + "\n" for i, w in enumerate(words) if i != odd) * 20)
    spm = [str(BIN / "python"), "-m", "recipes.study.spm"]
    subprocess.run([*spm, "train", "--model-prefix", root / "spm", "--vocab-size", "60", text],
                   check=True, capture_output=True, cwd=REPO)  # fmt: skip
    raw = root / "raw"
    raw.mkdir()
    subprocess.run([*spm, "encode", "--model", root / "spm.model", text, raw / "train.src"],
                   check=True, capture_output=True, cwd=REPO)  # fmt: skip
    pieces = (raw / "train.src").read_text()
    for split, lang in [(s, x) for s in ("train", "valid", "test") for x in ("src", "tgt")]:
        (raw / f"{split}.{lang}").write_text(pieces)
    data = preprocess(raw, root / "data-bin")
    ckpt = train(data, root / "model", "--max-update", "3", "--criterion", "cross_entropy")
    return {"root": root, "ud": ud, "data": data, "ckpt": ckpt, "words": words, "odd": odd}


def _run(setup: dict, work: Path, check: bool = True, **env) -> subprocess.CompletedProcess:
    full = dict(
        os.environ, WORK_DIR=str(work), DATA_BIN=str(setup["data"]), CKPT=str(setup["ckpt"]),
        SPM_MODEL=str(setup["root"] / "spm.model"), RAW_UD_DIR=str(setup["ud"]), SRC="src",
        TGT="tgt", BATCH_SIZE="5", OMP_NUM_THREADS="1",
    )  # fmt: skip
    full.update(env)
    full["PATH"] = f"{BIN}{os.pathsep}{full['PATH']}"
    proc = subprocess.run(
        ["bash", str(REPO / "recipes" / "score_syntax.sh")], capture_output=True, text=True,
        env=full,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_score_syntax_recipe_scores_encoder_heads_against_the_trees(setup, tmp_path):
    proc = _run(setup, tmp_path)
    out = tmp_path / "syntax" / "en_ewt-ud-test"
    # the source text: the words of each tree (multiword token and empty node skipped)
    lines = (out / "text" / "test.src").read_text().splitlines()
    assert lines == [" ".join(w) for w in setup["words"]]
    assert "I do n't like" in lines[1]
    # the placeholder target is the source
    assert (out / "spm" / "test.tgt").read_text() == (out / "spm" / "test.src").read_text()
    report = json.loads((out / "scores" / "heads.json").read_text())
    validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert report["syntax"]["matched"] == 11 and report["syntax"]["skipped"] == 1
    assert report["sentences"] == 12 and report["subset"] == "test"
    # only encoder self-attention is reported; every head has a syntax score
    assert set(report["sites"]) == {"enc-self"} and len(report["heads"]) == 2 * 4
    assert all(r["site"] == "enc-self" and r["syntax"] for r in report["heads"])
    assert {"nsubj_dep2head", "obj_head2dep", "amod_dep2head", "advmod_dep2head"} <= set(
        report["syntax"]["baselines"]
    )
    # amod: the adjective right before its noun, every time (offset +1, accuracy 1); two in
    # each of the 4 "ate" sentences, one in each of the other 7 matched ones
    amod = report["syntax"]["baselines"]["amod_dep2head"]
    assert amod["offset"] == 1 and amod["accuracy"] == 1.0 and amod["events"] == 4 * 2 + 7
    assert report["metrics"] == ["confidence", "entropy", "positional", "rare", "syntax"]
    files = {p.name for p in (out / "scores").iterdir()}
    assert {"summary.md", "heads.csv", "syntax_nsubj_dep2head.png", "confidence.png"} <= files
    assert "dec-" not in (out / "scores" / "heads.csv").read_text()
    assert "11 sentences matched, 1 skipped" in (out / "scores" / "summary.md").read_text()
    assert "12 sentences: 11 matched their tree, 1 skipped" in proc.stdout
    # resumable: a second run finds every step done and reports the same
    again = _run(setup, tmp_path)
    assert "fairseq-headprune score (" not in again.stderr
    assert again.stdout.splitlines() == proc.stdout.splitlines()[-1:]


def test_score_syntax_recipe_without_trees_names_the_settings(setup, tmp_path):
    """The default treebank missing and not downloadable (a reference that does not exist,
    or no network): a clear error, nothing scored."""
    empty = tmp_path / "no-ud"
    empty.mkdir()
    proc = _run(setup, tmp_path / "work", check=False, RAW_UD_DIR=str(empty),
                UD_EWT_REF="no-such-ref-0000")  # fmt: skip
    assert proc.returncode != 0
    assert "cannot download" in proc.stderr and "RAW_UD_DIR or CONLLU" in proc.stderr
    assert not (tmp_path / "work" / "syntax").exists()
    assert not (tmp_path / "work" / "ud" / "en_ewt-ud-test.conllu").exists()
