"""Micro-benchmark of what a ``cache_aware`` pool's ``tokenizer`` adds to the request path: CPU
microseconds per request to tokenize a chat body as the engine does (``ChatTokenizer.request_ids``: JSON,
chat template, byte-level BPE) when none of it was seen (``cold``: a new conversation) and when only its
last message is new (``next turn``: the pieces between the template's special tokens are kept), to hash
its token blocks (``kv_mirror.prompt_blocks``), and the whole ``CacheAware.order`` over two targets with
``kv_events`` for a next turn, against the same order without a tokenizer, for 2 kB and 24 kB prompts.

The tokenizer is a byte-level BPE of ``--vocab`` tokens trained here on the repository's docs (no
download); a real model's (Llama 3: 128k tokens) encodes at a similar cost per byte, its merges being
looked up the same way. Run with ``python -m perf.micro_tokenize``. I/O: reads docs/*.md, writes a
temporary model directory, prints to stdout.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.native import PrefixIndex
from gateway.routing.chat_tokenizer import ChatTokenizer
from gateway.routing.kv_mirror import prompt_blocks
from gateway.routing.load import StaticLoad
from gateway.routing.policies import CacheTuning, make_policy
from gateway.snapshot import Backend, Target

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def model_dir(directory: Path, text: str, vocab: int) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def conversation(text: str, size: int) -> bytes:
    """A chat body of about ``size`` bytes of content: a system prompt and alternating turns."""
    messages = [{"role": "system", "content": text[: min(size // 3, 4000)]}]
    at, role = 4000, "user"
    while sum(len(m["content"]) for m in messages) < size:
        messages.append({"role": role, "content": text[at : at + 700]})
        at += 700
        role = "assistant" if role == "user" else "user"
    messages.append({"role": "user", "content": "@@ " + text[at : at + 300]})  # @@: the turn's number
    return orjson.dumps({"model": "m", "messages": messages, "max_tokens": 64})


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    fn()
    n, start = 0, time.process_time()
    while (spent := time.process_time() - start) < seconds:
        for _ in range(20):
            fn()
        n += 20
    return spent / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per figure")
    args = p.parse_args()
    text = "\n".join(f.read_text() for f in sorted((ROOT / "docs").glob("*.md")))
    with tempfile.TemporaryDirectory() as tmp:
        tok = ChatTokenizer.load(str(model_dir(Path(tmp), text, args.vocab)))
    index = PrefixIndex.private(1 << 16)
    on = tuple(
        Target(f"pm-{n}", Backend(n, f"http://{n}", None, "openai", 1, 1, 1, kv_events="tcp://h:1"), "m")
        for n in "ab"
    )
    exact = make_policy("cache_aware", on, tuning=CacheTuning(), tokenizer=tok)
    approx = make_policy("cache_aware", on, tuning=CacheTuning())
    load = StaticLoad(index=index)
    print(f"byte-level BPE of {args.vocab} tokens; CPU microseconds per request")
    head = ("body", "tokens", "cold", "next turn", "blocks", "order+tok", "order", "added")
    print("".join(f"{h:>11}" for h in head))
    for size in (2_000, 24_000):
        body = conversation(text, size)
        ids = tok.request_ids(body)
        assert ids is not None

        turns = iter(range(10**9))

        def nth(body: bytes = body, turns: Iterator[int] = turns) -> bytes:
            return body.replace(b"@@", str(next(turns)).encode())

        def cold(body: bytes = body) -> object:
            tok.forget()
            return tok.request_ids(body)

        cold_us = per_call_us(cold, args.seconds)
        next_us = per_call_us(lambda: tok.request_ids(nth()), args.seconds)
        blocks_us = per_call_us(lambda ids=ids: prompt_blocks(index, ids), args.seconds)
        with_us = per_call_us(lambda: exact.order(nth(), load), args.seconds)
        without_us = per_call_us(lambda: approx.order(nth(), load), args.seconds)
        row = (len(body), len(ids), cold_us, next_us, blocks_us, with_us, without_us, with_us - without_us)
        print("".join(f"{v:>11.0f}" for v in row))


if __name__ == "__main__":
    main()
