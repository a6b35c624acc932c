"""The proxy host's usage spool: batches whole on disk, joined for resending, bounded and saying so."""

from __future__ import annotations

from pathlib import Path

from gateway.controlplane.fleet.spool import UsageSpool


def test_batches_are_kept_joined_and_removed(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool", 1 << 20)
    spool.write(b"[[1],[2]]")
    spool.write(b"[[3]]")
    (tmp_path / "spool" / "00000000000000000001.tmp").write_bytes(b"[[4")  # a writer that died
    again = UsageSpool(tmp_path / "spool", 1 << 20)  # a restarted host counts what is there
    assert again.state().batches == 2 and not list((tmp_path / "spool").glob("*.tmp"))
    paths, body = again.oldest()
    assert body == b"[[1],[2],[3]]" and len(paths) == 2
    again.remove(paths)
    assert again.empty and again.state().bytes == 0


def test_a_full_spool_refuses_and_says_so_until_it_has_room(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 20)
    assert spool.room_for(15)
    spool.write(b"[" + b"0" * 13 + b"]")
    assert not spool.room_for(10) and spool.state().full
    paths, _ = spool.oldest()
    spool.remove(paths)
    assert not spool.state().full and spool.room_for(10)
