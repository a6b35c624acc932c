"""The edge's flags become settings, bad networks stop the start, and the worker's file limit fits its
connection cap."""

from __future__ import annotations

import resource

import pytest

from gateway.commands.main import build_parser
from gateway.commands.options import settings_from_args
from gateway.dataplane.worker import head_timeout_ms, raise_file_limit


def serve(*argv: str) -> object:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_edge_flags_become_settings() -> None:
    s = serve(
        "--head-timeout",
        "2.5",
        "--body-timeout",
        "4",
        "--backpressure",
        "100",
        "--client-max-requests",
        "7",
        "--client-rate",
        "1.5",
        "--trusted-proxies",
        "10.0.0.0/8, 2001:db8::/32",
    )
    assert (s.head_timeout, s.body_timeout, s.backpressure) == (2.5, 4.0, 100)  # type: ignore[attr-defined]
    assert (s.client_max_requests, s.client_rate) == (7, 1.5)  # type: ignore[attr-defined]
    assert s.trusted_proxies == ("10.0.0.0/8", "2001:db8::/32")  # type: ignore[attr-defined]


def test_defaults() -> None:
    s = serve()
    assert (s.head_timeout, s.body_timeout, s.backpressure) == (30.0, 30.0, 16384)  # type: ignore[attr-defined]
    assert (s.client_max_requests, s.client_rate, s.trusted_proxies) == (4096, 0.0, ())  # type: ignore[attr-defined]


def test_a_bad_network_stops_the_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve("--trusted-proxies", "10.0.0.0/8,not-a-net")
    assert "not a network: 'not-a-net'" in capsys.readouterr().err


def test_headers_to_drop_are_names_lowercased(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s = serve("--drop-request-headers", "X-SSO-User, x-internal-token,")
    assert s.drop_request_headers == ("x-sso-user", "x-internal-token")  # type: ignore[attr-defined]
    assert serve().drop_request_headers == ()  # type: ignore[attr-defined]
    monkeypatch.setenv("GATEWAY_DROP_REQUEST_HEADERS", "X-Tenant-Token")
    assert serve().drop_request_headers == ("x-tenant-token",)  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        serve("--drop-request-headers", "x-ok, not a name")
    assert "not a header name: 'not a name'" in capsys.readouterr().err


def test_head_timeout_in_ms_and_off() -> None:
    assert head_timeout_ms(1.5) == 1500
    assert head_timeout_ms(0) == 86_400_000


def test_file_limit_is_raised_to_fit_the_connection_cap() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        want = min(hard, soft + 100) if hard != resource.RLIM_INFINITY else soft + 100
        got = raise_file_limit(want - 4096 if want > 4096 else 1)
        assert got >= min(want, hard if hard != resource.RLIM_INFINITY else want)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == got
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
