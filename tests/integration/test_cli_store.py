"""The control-plane CLI as a real subprocess against a real SQLite store in a temporary data directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.config.parser import load_config, parse_config
from gateway.controlplane.snapshot_build import build_snapshot_doc
from gateway.controlplane.store import open_store
from gateway.keys import hash_secret
from gateway.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "gateway.toml"
HASH_KEY_HEX = "11" * 32
MAIN = "import sys; from gateway.commands.main import main; sys.exit(main(sys.argv[1:]))"


def _gateway(
    data_dir: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HASH_KEY": HASH_KEY_HEX, "SGLANG_API_KEY": "sk-sglang", **(extra_env or {})})
    return subprocess.run(
        [sys.executable, "-c", MAIN, *args, "--data-dir", str(data_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def _snapshot(data_dir: Path) -> Snapshot:
    with open_store(Settings(data_dir=data_dir)) as store:
        return Snapshot.decode(orjson.dumps(build_snapshot_doc(store)), generation=1)


def test_apply_create_list_revoke_export(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _ok(_gateway(data, "apply", str(EXAMPLE))).strip() == "1"

    created = _gateway(
        data,
        "keys",
        "create",
        "--principal",
        "alice",
        "--name",
        "k1",
        "--expires",
        "4102444800",
        "--rpm",
        "20",
        "--concurrency",
        "2",
        "--budget",
        '{ period = "day", tokens = 5000, alerts = [0.5] }',
        "--budget",
        '{ period = "month", cost = 2.5 }',
    )
    secret = _ok(created).strip()
    assert secret.startswith("sk-gw-")
    assert "created key" in created.stderr and secret not in created.stderr

    snap = _snapshot(data)
    assert snap.revision == 2
    entry = snap.keys[hash_secret(secret, bytes.fromhex(HASH_KEY_HEX))]
    assert (entry.principal.name, entry.expires_at) == ("alice", 4102444800.0)
    assert entry.limits is not None
    assert (entry.limits.rpm, entry.limits.tpm, entry.limits.concurrency) == (20, None, 2)
    assert entry.budgets is not None and [
        (b.period, b.tokens, b.cost, b.alerts) for b in entry.budgets.key
    ] == [
        ("day", 5000, None, (0.5,)),
        ("month", None, 2_500_000_000, ()),
    ]
    assert entry.id in created.stderr
    assert snap.backends["sglang-a"].api_key == "sk-sglang"
    assert snap.routes["gpt-4o-mini"].canonical == "chat"

    listed = _ok(_gateway(data, "keys", "list", "--principal", "alice"))
    header, *rows = listed.splitlines()
    assert header.split() == [
        "ID",
        "NAME",
        "PRINCIPAL",
        "HASH",
        "STATUS",
        "CREATED",
        "EXPIRES",
        "MANAGED_BY",
        "LIMITS",
        "BUDGETS",
    ]
    assert sorted((r.split()[1], r.split()[4], r.split()[8], r.split()[9]) for r in rows) == [
        ("alice-laptop", "active", "-", "-"),
        ("k1", "active", "rpm=20,concurrency=2", "day:tokens=5000;month:cost=2.5"),
    ]
    # A budget the config file would refuse is refused here too, with the file's words.
    bad = _gateway(
        data, "keys", "create", "--principal", "alice", "--budget", '{ period = "week", tokens = 1 }'
    )
    assert bad.returncode == 2 and "--budget[0].period: must be" in bad.stderr
    assert secret not in listed

    _ok(_gateway(data, "keys", "revoke", "k1"))
    listed = _ok(_gateway(data, "keys", "list"))
    assert [r.split()[4] for r in listed.splitlines() if " k1 " in r] == ["revoked"]
    assert hash_secret(secret, bytes.fromhex(HASH_KEY_HEX)) not in _snapshot(data).keys

    header, *rows = _ok(_gateway(data, "principals", "list")).splitlines()
    assert header.split() == ["ID", "NAME", "ROLES", "ACTIVE_KEYS", "LIMITS", "MODEL_LIMITS", "BUDGETS"]
    assert sorted(tuple(line.split()[1:]) for line in rows) == [
        ("alice", "user", "1", "rpm=60,tpm=100000,concurrency=4", "chat(rpm=30)", "-"),
        (
            "batch-jobs",
            "llama-only,user",
            "1",
            "tpm=2000000",
            "chat(tpm=500000);llama-3.1-8b(concurrency=16)",
            "-",
        ),
        ("ops", "admin", "0", "-", "-", "-"),
    ]

    exported = _ok(_gateway(data, "export"))
    assert "at revision 3" in exported
    assert "sk-gw-example-secret" not in exported and "sk-sglang" not in exported
    doc = parse_config(tomllib.loads(exported), "export")
    assert [k.name for k in doc.keys] == ["alice-laptop", "batch-nightly"]
    # Limits survive the export: the exported file and the example describe the same limits.
    example = load_config(EXAMPLE)
    assert {p.name: (p.limits, p.model_limits) for p in doc.principals} == {
        p.name: (p.limits, p.model_limits) for p in example.principals
    }
    assert [k.limits for k in doc.keys] == [k.limits for k in example.keys]
    exported_file = tmp_path / "exported.toml"
    exported_file.write_text(exported)
    assert _ok(_gateway(data, "apply", str(exported_file))).strip() == "4"
    # Re-applying the export changed nothing but the revision: the imported keys keep their hashes.
    snap = _snapshot(data)
    laptop = snap.keys[hash_secret("sk-gw-example-secret-do-not-use-1", bytes.fromhex(HASH_KEY_HEX))]
    assert laptop.principal.name == "alice"
    assert laptop.principal.limits is not None and laptop.principal.limits.rpm == 60
    assert laptop.principal.model_limits is not None and laptop.principal.model_limits["chat"].rpm == 30


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("keys", "create", "--principal", "nobody"), {}, "gateway keys: error: no principal named 'nobody'"),
        (("keys", "create", "--principal", "alice", "--expires", "1"), {}, "--expires is in the past"),
        (
            ("keys", "create", "--principal", "alice", "--expires", "soon"),
            {},
            "--expires must be an RFC 3339",
        ),
        (("keys", "create", "--principal", "alice", "--rpm", "0"), {}, "--rpm must be a positive integer"),
        (("keys", "create", "--principal", "alice", "--tpm", "lots"), {}, "--tpm must be a positive integer"),
        (
            ("keys", "create", "--principal", "alice", "--concurrency", "1.5"),
            {},
            "--concurrency must be a positive integer",
        ),
        (("keys", "revoke", "nope"), {}, "no key with id or name 'nope'"),
        (("keys", "list", "--principal", "nobody"), {}, "no principal named 'nobody'"),
        (
            ("principals", "list"),
            {"GATEWAY_DATABASE": "postgresql://gateway:pw@127.0.0.1:1/db"},
            "cannot connect to PostgreSQL at postgresql://gateway:***@127.0.0.1:1/db",
        ),
        (("apply", "/nonexistent.toml"), {}, "/nonexistent.toml: cannot read"),
    ],
)
def test_errors_exit_2_with_a_one_line_message(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    _ok(_gateway(tmp_path, "apply", str(EXAMPLE)))
    result = _gateway(tmp_path, *args, extra_env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stdout == ""


def test_invalid_file_names_the_place_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[backends]]\nname = "x"\nurl = "ftp://x"\n')
    result = _gateway(tmp_path / "data", "apply", str(bad))
    assert result.returncode == 2
    assert (
        result.stderr
        == f"gateway apply: error: {bad}:3: backends[0].url: must be an http:// or https:// URL\n"
    )
    with open_store(Settings(data_dir=tmp_path / "data")) as store:
        assert store.revision() == 0


def test_apply_needs_backend_key_env(tmp_path: Path) -> None:
    result = _gateway(tmp_path, "apply", str(EXAMPLE), extra_env={"SGLANG_API_KEY": ""})
    assert result.returncode == 2
    assert "environment variable SGLANG_API_KEY is not set" in result.stderr
