"""Micro-benchmark of the prompt classes' fast tier: CPU microseconds to classify one typical chat
request (``prompt_text`` on its body, then ``Classifier.classify``), with six classes of eight examples
each, and what a request costs when no rule names a class (nothing: the classifier is never called). Run
with ``python -m perf.micro_prompt_class``. I/O: prints to stdout.
"""

from __future__ import annotations

import time

import orjson

from gateway.routing.prompt_classes import Classifier, PromptClass, prompt_text

CLASSES = {
    "code": [
        "write a python function that sorts a list of dictionaries by a key",
        "fix this bug in my javascript code, the promise never resolves",
        "how do I reverse a linked list in C without recursion",
        "refactor this class to use dependency injection",
        "why does my SQL query return duplicate rows after a join",
        "explain this stack trace from my Java service",
        "write unit tests for this Go HTTP handler",
        "how can I make this database insert idempotent",
    ],
    "math": [
        "solve the equation 3x + 5 = 20 for x",
        "what is the integral of x squared from 0 to 3",
        "prove that the square root of two is irrational",
        "compute the derivative of sin x times cos x",
        "what is the probability of two sixes with two dice",
        "find the eigenvalues of this 2 by 2 matrix",
        "how many ways can 5 people sit around a round table",
        "simplify this algebraic expression",
    ],
    "writing": [
        "write a cover letter for a senior engineer position",
        "proofread this paragraph and fix the grammar",
        "make this email sound more polite",
        "write a short story about a lighthouse keeper",
        "summarise this article in three sentences",
        "rewrite this text for a ten year old",
        "write a product description for a coffee grinder",
        "suggest a title for my blog post about hiking",
    ],
    "chat": [
        "tell me a joke about cats",
        "how was your day",
        "recommend a good movie for tonight",
        "what should I cook for dinner",
        "I feel bored, any ideas",
        "what is your favourite colour",
        "say something nice",
        "let's talk about football",
    ],
    "legal": [
        "is this clause in my rental contract enforceable",
        "what does indemnification mean in this agreement",
        "can my employer change my contract without notice",
        "explain the difference between a patent and a trademark",
        "what are my rights if a product I bought is faulty",
        "review this non disclosure agreement",
        "how does copyright apply to code I wrote at work",
        "what is the statute of limitations for a contract claim",
    ],
    "translation": [
        "translate this sentence into French",
        "how do you say good morning in Japanese",
        "translate the following paragraph to German",
        "what does this Spanish phrase mean in English",
        "translate this menu from Italian",
        "give me the Portuguese for thank you very much",
        "translate this error message into English",
        "how would a native speaker say this in Dutch",
    ],
}

# A typical chat request: a system prompt and a user turn of about 90 words (~520 bytes of text).
BODY = orjson.dumps(
    {
        "model": "chat",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": (
                    "I have a Python service that reads orders from a queue and writes them to PostgreSQL. "
                    "Sometimes the same order is written twice, and I see duplicate rows. Here is the "
                    "relevant code: def handle(msg): order = parse(msg); db.insert(order); msg.ack(). How "
                    "can I make this idempotent so that a redelivered message does not create a duplicate "
                    "row? Please explain the options and show the code, with the SQL for the table."
                ),
            },
        ],
        "max_tokens": 512,
    }
)
ROUNDS = 20000


def main() -> None:
    classifier = Classifier(tuple(PromptClass(n, tuple(e)) for n, e in CLASSES.items()))
    print(f"classes: {len(CLASSES)}, vocabulary: {len(classifier.vocab)} terms, body: {len(BODY)} bytes")
    print("class of the typical prompt:", classifier.classify(prompt_text(BODY)))
    text = prompt_text(BODY)
    for label, work in (
        ("prompt_text + classify", lambda: classifier.classify(prompt_text(BODY))),
        ("classify only", lambda: classifier.classify(text)),
    ):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            for _ in range(ROUNDS):
                work()
            best = min(best, time.process_time() - start)
        print(f"{label}: {best / ROUNDS * 1e6:.1f} us CPU per request")


if __name__ == "__main__":
    main()
