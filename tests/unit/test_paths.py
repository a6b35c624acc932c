"""Which decoded request paths the proxy forwards, and the under-the-prefix check of upstream targets."""

from __future__ import annotations

import pytest

from gateway.protocol.paths import check_client_path, target_is_safe

FORWARDED = [
    "/v1/chat/completions",
    "/v1/models",
    "/v1/files/file-abc_123",
    "/v1/.well-known",  # a segment that starts with a dot is not a dot-segment
    "/v1/a..b",
    "/v1/fine-tunes/ft:gpt-4o@2024;x=1",
]

REFUSED = {
    "/v1/../secret": "dot-segment",
    "/v1/%2e%2e": "'%'",  # granian decoded once; a "%" left is a double encoding
    "/v1/a/..": "dot-segment",
    "/v1/./chat": "dot-segment",
    "/v1/.": "dot-segment",
    "/v1/chat completions": "a space",
    "/v1/a\rb": "a CR",
    "/v1/a\nb": "an LF",
    "/v1/a\x00b": "a NUL",
    "/v1/a\\..\\b": "a backslash",
    "/v1//chat": "empty segment",
    "/v1/caf\u00e9": "the character",
    "/v1/\ufffd": "the character",  # what granian makes of an invalid %ff
    "/v1/a\tb": "the character",
}


@pytest.mark.parametrize("path", FORWARDED)
def test_ordinary_paths_are_forwarded(path: str) -> None:
    assert check_client_path(path) is None
    assert target_is_safe(path)
    assert target_is_safe(path + "?after=/../x&q=%2e")  # the query is not a path: not checked


@pytest.mark.parametrize("path", REFUSED)
def test_unsafe_paths_are_refused_saying_why(path: str) -> None:
    why = check_client_path(path)
    assert why is not None and REFUSED[path] in why
    assert not target_is_safe(path)


@pytest.mark.parametrize("target", ["", "v1/chat", "?q=1", "../x", "/v1beta/models/../../x:generate"])
def test_targets_that_would_leave_the_prefix(target: str) -> None:
    assert not target_is_safe(target)
