"""The ownership rules of configuration entries (sans-I/O): what a file's apply and a store apply lead
to, what is refused, and the diff the audit log keeps."""

from __future__ import annotations

import pytest

from gateway.controlplane.config.specs import BackendSpec, ConfigDoc, RoleSpec
from gateway.controlplane.store._ownership import STORE_OWNER, diff, merge
from gateway.errors import OwnershipConflict

F, G = "file:/etc/a.toml", "file:/etc/b.toml"
R = RoleSpec("r", ("model/*",))
S = RoleSpec("s", ())


def test_a_file_replaces_only_its_own_entries() -> None:
    current = ConfigDoc(roles=(R, S, RoleSpec("t", ())))
    owners = {("roles", "r"): F, ("roles", "t"): G}  # s is the store's
    merged, after = merge(current, owners, ConfigDoc(roles=(RoleSpec("u", ()),)), F)
    assert sorted(r.name for r in merged.roles) == ["s", "t", "u"]
    assert after == {("roles", "t"): G, ("roles", "u"): F}
    assert diff(current, merged, owners, after) == {"added": {"roles": ["u"]}, "removed": {"roles": ["r"]}}


def test_a_file_takes_over_what_it_declares() -> None:
    current = ConfigDoc(roles=(S,))
    merged, after = merge(current, {}, ConfigDoc(roles=(RoleSpec("s", ("model/x",)),)), F)
    assert merged.roles == (RoleSpec("s", ("model/x",)),) and after == {("roles", "s"): F}
    assert diff(current, merged, {}, after) == {
        "changed": {"roles": ["s"]},
        "owner_changed": {"roles": ["s"]},
    }


def test_the_store_cannot_touch_a_file_s_entries() -> None:
    current = ConfigDoc(roles=(R, S))
    owners = {("roles", "r"): F}
    with pytest.raises(OwnershipConflict, match=r"roles/r is owned by the config file /etc/a\.toml"):
        merge(current, owners, ConfigDoc(roles=(S,)), STORE_OWNER)
    with pytest.raises(OwnershipConflict, match="cannot be changed"):
        merge(current, owners, ConfigDoc(roles=(RoleSpec("r", ()), S)), STORE_OWNER)
    merged, after = merge(current, owners, ConfigDoc(roles=(R,)), STORE_OWNER)  # drops its own s
    assert merged.roles == (R,) and after == {("roles", "r"): F}


def test_credentials_are_write_only_in_the_comparison() -> None:
    stored = BackendSpec("b", "http://h", api_key="sk-stored")
    owners = {("backends", "b"): F}
    merge(
        ConfigDoc(backends=(stored,)),
        owners,
        ConfigDoc(backends=(BackendSpec("b", "http://h"),)),
        STORE_OWNER,
    )
    with pytest.raises(OwnershipConflict):
        other = BackendSpec("b", "http://h", api_key="sk-other")
        merge(ConfigDoc(backends=(stored,)), owners, ConfigDoc(backends=(other,)), STORE_OWNER)


def test_the_fallback_has_an_owner_too() -> None:
    current = ConfigDoc(roles=(R,), fallback="x")
    owners = {("routing", "fallback"): F}
    assert merge(current, owners, ConfigDoc(), G)[0].fallback == "x"  # another file leaves it
    assert merge(current, owners, ConfigDoc(), F)[0].fallback is None  # its file drops it
    with pytest.raises(OwnershipConflict, match="routing/fallback"):
        merge(current, owners, ConfigDoc(roles=(R,), fallback="y"), STORE_OWNER)
    merged, after = merge(ConfigDoc(fallback="x"), {}, ConfigDoc(fallback="y"), STORE_OWNER)
    assert merged.fallback == "y" and after == {}
