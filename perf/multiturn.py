"""The multi-turn chat workload of the routing-quality benchmark: seeded sessions over a few shared system
prompts, as a chat product sends them to a fleet of engines with prefix caches.

``make_workload(sessions, seed)`` draws, from ``random.Random(seed)`` alone (so the same seed gives the same
workload to every router and on every machine):

- ``systems`` shared system prompts of ``system_tokens`` tokens each (uniform in the range), random words;
- per session: which system prompt it uses, 3-10 turns, each turn a user message of 50-300 tokens, the
  ``max_tokens`` of its answer (32-64), and the think time before the next turn as a multiple of the mean
  (exponential, mean 1: the runner multiplies by the load's mean), and its start offset, also in means.

Tokens are the engine simulator's (SIM_SPEC): 4 bytes of UTF-8 text; every text here is ASCII words cut
to exactly ``4 * tokens`` bytes. The answers are the engine's: a session appends the answer exactly as
received to its history, so the next turn's prompt has the previous prompt and answer as its prefix.

``working_set_tokens`` sizes the fleet's KV caches from the workload. No I/O.
"""

from __future__ import annotations

import random
import statistics
import string
from dataclasses import dataclass

__all__ = [
    "BYTES_PER_TOKEN",
    "Session",
    "Turn",
    "Workload",
    "make_workload",
    "rendered_tokens",
    "working_set_tokens",
]

BYTES_PER_TOKEN = 4
SYSTEM_TOKENS = (2000, 6000)
TURNS = (3, 10)
USER_TOKENS = (50, 300)
ANSWER_TOKENS = (32, 64)


@dataclass(frozen=True, slots=True)
class Turn:
    user: str  # the new user message, exactly USER tokens * 4 bytes
    max_tokens: int  # of the answer
    think: float  # pause after the answer, in means of the load's think time (exponential, mean 1)


@dataclass(frozen=True, slots=True)
class Session:
    index: int
    system: int  # which of the workload's system prompts
    start: float  # start offset in means of the load's stagger (cumulative exponential gaps)
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    seed: int
    systems: tuple[str, ...]
    sessions: tuple[Session, ...]

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def _words(rng: random.Random, vocabulary: list[str], tokens: int) -> str:
    """Random words, cut to exactly ``tokens`` tokens (4 bytes each)."""
    size = tokens * BYTES_PER_TOKEN
    parts: list[str] = []
    length = -1  # the joined length: a space between words
    while length < size:
        word = rng.choice(vocabulary)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)[:size]


def make_workload(
    sessions: int = 200,
    seed: int = 1,
    *,
    systems: int = 4,
    turns: tuple[int, int] = TURNS,
    system_tokens: tuple[int, int] = SYSTEM_TOKENS,
    user_tokens: tuple[int, int] = USER_TOKENS,
    answer_tokens: tuple[int, int] = ANSWER_TOKENS,
) -> Workload:
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(4096)
    ]
    prompts = tuple(_words(rng, vocabulary, rng.randint(*system_tokens)) for _ in range(systems))
    out: list[Session] = []
    start = 0.0
    for i in range(sessions):
        system = rng.randrange(systems)
        count = rng.randint(*turns)
        session_turns = tuple(
            Turn(
                _words(rng, vocabulary, rng.randint(*user_tokens)),
                rng.randint(*answer_tokens),
                rng.expovariate(1.0),
            )
            for _ in range(count)
        )
        out.append(Session(i, system, start, session_turns))
        start += rng.expovariate(1.0)
    return Workload(seed, prompts, tuple(out))


def rendered_tokens(messages: list[dict[str, str]]) -> int:
    """Prompt tokens as the simulator counts them: ``<|role|>\\n`` + content + ``\\n`` per message, then
    ``<|assistant|>\\n``, 4 bytes a token, a last partial token counted."""
    size = sum(len(f"<|{m['role']}|>\n{m['content']}\n".encode()) for m in messages) + len(b"<|assistant|>\n")
    return -(-size // BYTES_PER_TOKEN)


def working_set_tokens(workload: Workload, active: int) -> int:
    """The KV tokens the fleet needs to keep every prefix it will be asked for again: the system prompts,
    plus ``active`` sessions' histories at their mean final length (every turn's user message and answer,
    the chat template's markers included). One copy of each; a router that spreads a prefix over several
    engines needs more."""
    systems = sum(-(-len(s) // BYTES_PER_TOKEN) for s in workload.systems)
    private = [
        sum(len(t.user) // BYTES_PER_TOKEN + t.max_tokens + 6 for t in s.turns) for s in workload.sessions
    ]
    return systems + int(active * statistics.fmean(private))
