"""Pattern aliases: shell-style, case-sensitive, first match wins, what a name resolved to remembered in a
bounded table."""

from __future__ import annotations

from gateway.routing.aliases import MEMO_SIZE, PatternAliases, is_pattern


def test_patterns_match_like_fnmatchcase_first_wins() -> None:
    aliases = PatternAliases([("claude-*-haiku-*", "small"), ("claude-?-*", "old"), ("claude-*", "chat")])
    assert aliases.match("claude-3-5-haiku-20241022") == "small"
    assert aliases.match("claude-3-opus") == "old"
    assert aliases.match("claude-opus-4-5") == "chat"
    assert aliases.match("CLAUDE-opus") is None
    assert aliases.match("claude") is None
    assert PatternAliases([("m[0-9]", 1)]).match("m7") == 1
    assert not PatternAliases() and PatternAliases().match("anything") is None


def test_the_memo_is_bounded() -> None:
    aliases = PatternAliases([("x-*", "x")])
    for i in range(MEMO_SIZE * 3):
        assert aliases.match(f"x-{i}") == "x"
        assert aliases.match(f"y-{i}") is None
    assert len(aliases._memo) <= MEMO_SIZE


def test_what_is_a_pattern() -> None:
    assert is_pattern("claude-*") and is_pattern("m?") and is_pattern("m[ab]")
    assert not is_pattern("gpt-4o-mini")
