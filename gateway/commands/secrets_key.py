"""``gateway secrets rotate``: re-encrypt every backend credential in the store with a new secrets key
(``gateway.controlplane.credentials``), in one transaction with its audit entry. I/O: the secrets key
file under the data directory, the store; stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import cli_actor
from gateway.controlplane.credentials import SECRETS_KEY_ENV, new_env_key, rotate_key_file
from gateway.controlplane.store import open_store, store_vault

__all__ = ["register"]


def register(sub: Any) -> None:
    secrets = sub.add_parser("secrets", help="the key that encrypts backend credentials in the store")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    p = secrets_sub.add_parser(
        "rotate",
        help=f"re-encrypt every backend credential with a new key (DATA_DIR/secrets.key, or "
        f"{SECRETS_KEY_ENV}_NEW when the key comes from {SECRETS_KEY_ENV})",
    )
    finish_command(p, _cmd_secrets_rotate)


def _cmd_secrets_rotate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    vault = store_vault(settings)
    with open_store(settings, vault) as store:
        if os.environ.get(SECRETS_KEY_ENV):
            new = new_env_key()
            count = store.seal_credentials(vault.with_current(new), actor=cli_actor())
            print(
                f"re-encrypted {count} credential(s) with the key in {SECRETS_KEY_ENV}_NEW; set "
                f"{SECRETS_KEY_ENV} to it on every control plane and restart them",
                file=sys.stderr,
            )
            return 0
        old_id, new_id, count = rotate_key_file(
            settings.data_dir,
            lambda key: store.seal_credentials(vault.with_current(key), actor=cli_actor()),
        )
    print(f"re-encrypted {count} credential(s): secrets key {old_id} replaced by {new_id}", file=sys.stderr)
    return 0
