"""Syntactic heads: does a head's most-attended word follow a dependency relation?

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019, §5.2): for the relations nsubj, obj, amod and
advmod, in both directions (``dep2head``: from the dependent to its head; ``head2dep``: from
the head to a dependent with that relation), the accuracy of "most-attended word = the
related word" in encoder self-attention, next to a positional baseline: the most frequent
relative offset of the related word for that relation and direction.

Subword attention is aggregated to words: attention TO a word is the sum over its subwords,
attention FROM a word the mean over its subwords; the source EOS is not a word. ``head2dep``
counts a hit when the most-attended word is any dependent of the head with that relation.

Trees come from gold CoNLL-U (``read_conllu``; multiword-token lines ``3-4`` and empty nodes
``8.1`` are skipped, relation subtypes folded: ``nsubj:pass`` → ``nsubj``, ``dobj`` → ``obj``)
or from stanza's parser (``parse_with_stanza``). Tree i belongs to source sentence i when its
words equal the detokenised source words (``<unk>`` matches any word); others are skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fairseq_headprune.scoring.base import CapturedBatch, PassScorer, Scores, ScoringModel
from fairseq_headprune.sites import ENC_SELF

RELATIONS = ("nsubj", "obj", "amod", "advmod")
DIRECTIONS = ("dep2head", "head2dep")
_INT_ID = re.compile(r"^[1-9][0-9]*$")
_SKIPPED_ID = re.compile(r"^[0-9]+(-[0-9]+|\.[0-9]+)$")


@dataclass
class Tree:
    words: list[str]
    heads: list[int]  # 0-based index of each word's head; -1 for the root
    deprels: list[str]  # base relation (subtype folded)


def fold_relation(deprel: str) -> str:
    base = deprel.split(":")[0]
    return "obj" if base == "dobj" else base


def _doc_to_trees(doc) -> list[Tree]:
    return [
        Tree(
            [w.text for w in s.words],
            [int(w.head) - 1 for w in s.words],
            [fold_relation(w.deprel or "_") for w in s.words],
        )
        for s in doc.sentences
    ]


def read_conllu(path: str | Path) -> list[Tree]:
    """Gold trees of a CoNLL-U file, via ``stanza.utils.conll.CoNLL.conll2doc``."""
    from stanza.utils.conll import CoNLL

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no CoNLL-U file at {path}")
    kept = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            kept.append(line)
            continue
        cols = line.split("\t")
        if len(cols) != 10 or not (_INT_ID.match(cols[0]) or _SKIPPED_ID.match(cols[0])):
            raise ValueError(f"{path}:{lineno}: not a CoNLL-U word line (10 tab-separated fields)")
        if _SKIPPED_ID.match(cols[0]):
            continue  # multiword token or empty node
        if not cols[6].isdigit():
            raise ValueError(f"{path}:{lineno}: CoNLL-U HEAD must be a number, got {cols[6]!r}")
        kept.append(line)
    try:
        doc = CoNLL.conll2doc(input_str="\n".join(kept) + "\n\n")
    except Exception as e:  # stanza raises several types for malformed input
        raise ValueError(f"{path}: cannot parse as CoNLL-U: {e}") from e
    trees = _doc_to_trees(doc)
    if not trees:
        raise ValueError(f"{path}: no sentences in the CoNLL-U file")
    return trees


def parse_with_stanza(sentences: list[list[str]]) -> list[Tree]:
    """Dependency trees of pre-tokenised English sentences by stanza's parser."""
    import stanza

    try:
        nlp = stanza.Pipeline(
            "en",
            processors="tokenize,pos,lemma,depparse",
            tokenize_pretokenized=True,
            download_method=None,
            verbose=False,
        )
    except Exception as e:
        raise ValueError(
            f"cannot load stanza's English models ({type(e).__name__}: {e}). Run "
            "python -c \"import stanza; stanza.download('en')\" once, or pass gold trees "
            "with --conllu FILE"
        ) from e
    return _doc_to_trees(nlp(sentences))


def source_words(pieces: list[str]) -> tuple[list[str], list[int]]:
    """Token strings of one source sentence → (words, word index of each token).

    Sentencepiece (``▁`` starts a word), subword-nmt BPE (``@@`` continues it) or
    whitespace-tokenised text (one token per word)."""
    words: list[str] = []
    word_of: list[int] = []
    spm = any("\u2581" in p for p in pieces)
    glue = False
    for p in pieces:
        if spm:
            new = p.startswith("\u2581") or not words
            p = p.replace("\u2581", "")
        else:
            new = not glue
            glue = p.endswith("@@")
            p = p[:-2] if glue else p
        if new:
            words.append(p)
        else:
            words[-1] += p
        word_of.append(len(words) - 1)
    return words, word_of


def matches(tree_words: list[str], words: list[str], unk: str = "<unk>") -> bool:
    return len(tree_words) == len(words) and all(
        w == t or w == unk for w, t in zip(words, tree_words)
    )


class SyntaxAccuracy(PassScorer):
    """Per relation and direction: accuracy of each encoder self-attention head, and the
    accuracy of the most frequent offset (the positional baseline)."""

    def __init__(
        self,
        trees: dict[int, Tree],
        word_of: dict[int, list[int]],
        relations: tuple[str, ...] = RELATIONS,
    ) -> None:
        """``trees`` and ``word_of`` (word index per source token, EOS excluded) by
        sentence id, for the sentences whose tree matched."""
        self.trees, self.word_of, self.relations = trees, word_of, relations
        self.hits: dict[tuple[str, str], Tensor] = {}
        self.n: Counter = Counter()
        self.offsets: dict[tuple[str, str], Counter] = {}

    def update(self, sm: ScoringModel | None, batch: CapturedBatch) -> None:
        layers = sorted(k[1] for k in batch.weights if k[0] == ENC_SELF)
        if not layers:
            return
        w = torch.stack([batch.weights[ENC_SELF, i] for i in layers]).float()  # (L,H,B,S,S)
        src = batch.query_tokens[ENC_SELF]  # (B, S)
        for b, sid in enumerate(batch.sample["id"].tolist()):
            if sid not in self.trees:
                continue
            word_of = torch.tensor(self.word_of[sid])  # (n,)
            pos = src.shape[1] - 1 - len(word_of) + torch.arange(len(word_of))  # left-padded
            self.add(self.trees[sid], w[:, :, b][..., pos[:, None], pos[None, :]], word_of)

    def add(self, tree: Tree, w: Tensor, word_of: Tensor) -> None:
        """One sentence: token maps ``w`` (L, H, n, n) without EOS, ``word_of`` (n,)."""
        nw = len(tree.words)
        to_word = torch.nn.functional.one_hot(word_of, nw).float()  # (n, nw)
        from_word = to_word.T / to_word.sum(0)[:, None].clamp_min(1)  # (nw, n) mean
        words = from_word @ w @ to_word  # (L, H, nw, nw)
        top = words.argmax(-1)  # (L, H, nw)
        for dep, (head, rel) in enumerate(zip(tree.heads, tree.deprels)):
            if rel not in self.relations or head < 0:
                continue
            deps = [
                d
                for d, (h, r) in enumerate(zip(tree.heads, tree.deprels))
                if h == head and r == rel
            ]
            for direction, src, targets in (("dep2head", dep, [head]), ("head2dep", head, deps)):
                if direction == "head2dep" and dep != deps[0]:
                    continue  # one event per (head, relation)
                key = rel, direction
                hit = torch.zeros(top.shape[:2], dtype=torch.bool)  # (L, H)
                for t in targets:
                    hit |= top[:, :, src] == t
                self.hits[key] = self.hits.get(key, 0) + hit.float()
                self.n[key] += 1
                offsets = self.offsets.setdefault(key, Counter())
                offsets.update({t - src for t in targets})

    def result(self) -> Scores:
        """``syntax_<rel>_<dir>``: {"enc-self": (L, H) accuracy}; ``baseline_<rel>_<dir>``:
        a 0-d tensor, the most-frequent-offset accuracy (NaN without events)."""
        out: Scores = {}
        for rel in self.relations:
            for direction in DIRECTIONS:
                key, name = (rel, direction), f"{rel}_{direction}"
                n = self.n[key]
                if n == 0:
                    continue
                out[f"syntax_{name}"] = {ENC_SELF: self.hits[key] / n}
                best = self.offsets[key].most_common(1)[0]
                out[f"baseline_{name}"] = {
                    ENC_SELF: torch.tensor(min(best[1] / n, 1.0)),
                    "offset": torch.tensor(best[0]),
                    "events": torch.tensor(n),
                }
        return out
