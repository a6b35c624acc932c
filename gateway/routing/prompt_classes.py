"""Prompt classes: the semantic-routing fast tier, built from the operator's example prompts.

Each class is declared by example prompts (and optional keywords). At snapshot decode, the examples become
a TF-IDF model over word unigrams and bigrams: one centroid per class (the mean of its examples' unit
vectors, renormalised), each term weighted by its smoothed inverse document frequency over all examples.
A prompt is classified by the cosine similarity of its own TF-IDF vector with each centroid; a keyword
present in the prompt (as a word, or a phrase of words) makes that class's score 1.0. The best score wins
if it reaches the class's ``min_score``; ties go to the class declared first. Nothing is downloaded or
learnt at run time, and no randomness or per-process hash enters (terms are looked up in an exact
vocabulary), so the same prompt always gets the same class on every worker and host.

Which text: the last user turn of a chat or Messages request (its text parts), or a completion's
``prompt``; at most ``MAX_CHARS`` of it (the end, where the question usually is). The request path asks
only when a rule names a class (``Facts.prompt_class``), once per request. No I/O here.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MAX_CHARS", "Classifier", "PromptClass", "prompt_text"]

MAX_CHARS = 4000  # of the prompt's text classified: its last 4,000 characters
_WORD = re.compile(r"[^\W_]+")


def _terms(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    # Unigrams; the first five letters of longer words, marked with "~" (a crude stem: "sorted" and
    # "sorting", "movies" and "movie" meet); bigrams joined by a space (never inside a word).
    return (
        words
        + ["~" + w[:5] for w in words if len(w) >= 5]
        + [f"{a} {b}" for a, b in itertools.pairwise(words)]
    )


@dataclass(frozen=True, slots=True)
class PromptClass:
    name: str
    examples: tuple[str, ...]
    keywords: tuple[str, ...] = ()
    min_score: float = 0.1

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> PromptClass:
        return cls(
            str(doc["name"]),
            tuple(str(e) for e in doc.get("examples") or ()),
            tuple(str(k) for k in doc.get("keywords") or ()),
            float(doc.get("min_score", 0.1)),
        )


class Classifier:
    """The compiled classes: a vocabulary of term -> (idf, per-class centroid weights)."""

    __slots__ = ("_keywords", "_oov", "classes", "vocab")

    def __init__(self, classes: tuple[PromptClass, ...]) -> None:
        self.classes = classes
        docs = [(i, _terms(e)) for i, c in enumerate(classes) for e in c.examples]
        df: dict[str, int] = {}
        for _, terms in docs:
            for t in set(terms):
                df[t] = df.get(t, 0) + 1
        n = len(docs)
        idf = {t: math.log((1 + n) / (1 + d)) + 1.0 for t, d in df.items()}
        self._oov = math.log(1 + n) + 1.0  # a term no example has: as rare as can be
        centroids: list[dict[str, float]] = [{} for _ in classes]
        for i, terms in docs:
            vec = _weights(terms, idf, self._oov)
            norm = math.sqrt(sum(w * w for w in vec.values())) or 1.0
            for t, w in vec.items():
                centroids[i][t] = centroids[i].get(t, 0.0) + w / norm
        # term -> (idf, ((class index, centroid weight / centroid norm), ...)): one lookup per prompt term
        vocab: dict[str, tuple[float, tuple[tuple[int, float], ...]]] = {}
        norms = [math.sqrt(sum(w * w for w in c.values())) or 1.0 for c in centroids]
        for t, w_idf in idf.items():
            vocab[t] = (
                w_idf,
                tuple((i, c[t] / norms[i]) for i, c in enumerate(centroids) if t in c),
            )
        self.vocab = vocab
        self._keywords = tuple(
            (i, tuple(" ".join(_WORD.findall(k.lower())) for k in c.keywords)) for i, c in enumerate(classes)
        )

    def scores(self, text: str) -> list[float]:
        """Each class's score for ``text``, in declaration order."""
        text = text[-MAX_CHARS:]
        terms = _terms(text)
        scores = [0.0] * len(self.classes)
        if terms:
            counts: dict[str, int] = {}
            for t in terms:
                counts[t] = counts.get(t, 0) + 1
            vocab, oov = self.vocab, self._oov
            norm2 = 0.0
            for t, tf in counts.items():
                entry = vocab.get(t)
                w = tf * (entry[0] if entry is not None else oov)
                norm2 += w * w
                if entry is not None:
                    for i, cw in entry[1]:
                        scores[i] += w * cw
            norm = math.sqrt(norm2) or 1.0
            scores = [s / norm for s in scores]
        if self._keywords:
            padded = " " + " ".join(_WORD.findall(text.lower())) + " "
            for i, keywords in self._keywords:
                if any(k and f" {k} " in padded for k in keywords):
                    scores[i] = 1.0
        return scores

    def classify(self, text: str) -> tuple[str | None, float]:
        """The class of ``text`` and its score; ``(None, best score)`` when no class reaches its
        ``min_score``."""
        scores = self.scores(text)
        best, best_score = None, 0.0
        for c, s in zip(self.classes, scores, strict=True):
            if s > best_score:
                best, best_score = c, s
        if best is None or best_score < best.min_score:
            return None, round(best_score, 4)
        return best.name, round(best_score, 4)


def _weights(terms: list[str], idf: dict[str, float], oov: float) -> dict[str, float]:
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return {t: tf * idf.get(t, oov) for t, tf in counts.items()}


def prompt_text(body: bytes) -> str:
    """The text to classify in a request body: the last user turn's text, or a completion's prompt."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(doc, dict):
        return ""
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], str):
        return prompt[-1]
    return ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts and Anthropic content blocks alike
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
