"""The seqlock publication of snapshots: monotonic, consistent, visible across forked processes."""

from __future__ import annotations

import os

import pytest

from gateway.shm.segment import Segment
from gateway.shm.snapshot_slot import HEADER_BYTES, PublishRefused, SnapshotPublisher, SnapshotReader


@pytest.fixture
def segment():
    seg = Segment.create(HEADER_BYTES + 2 * 4096)
    yield seg
    seg.close()


def test_nothing_published_reads_none(segment: Segment) -> None:
    assert SnapshotReader(segment.buf).read() is None
    assert SnapshotReader(segment.buf).generation() == 0


def test_publish_then_read(segment: Segment) -> None:
    pub = SnapshotPublisher(segment.buf)
    reader = SnapshotReader(segment.buf)
    assert pub.publish(b'{"a":1}', revision=3) == 1
    assert reader.read() == (1, b'{"a":1}')
    assert pub.publish(b'{"a":22}', revision=4) == 2
    assert reader.read() == (2, b'{"a":22}')
    assert pub.publish(b"x", revision=4) == 3  # same revision republished: allowed
    assert reader.read() == (3, b"x")


def test_older_revision_never_replaces_newer(segment: Segment) -> None:
    pub = SnapshotPublisher(segment.buf)
    pub.publish(b"new", revision=10)
    with pytest.raises(PublishRefused):
        pub.publish(b"old", revision=9)
    assert SnapshotReader(segment.buf).read() == (1, b"new")


def test_oversized_document_is_refused(segment: Segment) -> None:
    pub = SnapshotPublisher(segment.buf)
    with pytest.raises(PublishRefused):
        pub.publish(b"x" * 4097, revision=1)


def test_new_publisher_closes_a_window_left_open(segment: Segment) -> None:
    pub = SnapshotPublisher(segment.buf)
    pub.publish(b"doc", revision=1)
    segment.buf[8:16] = (int.from_bytes(segment.buf[8:16], "little") + 1).to_bytes(8, "little")  # odd seq
    SnapshotPublisher(segment.buf)  # a restarted control worker
    assert SnapshotReader(segment.buf).read() == (1, b"doc")


def test_forked_reader_sees_publications(segment: Segment) -> None:
    pub = SnapshotPublisher(segment.buf)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for generation 2 and report what it read
        reader = SnapshotReader(segment.buf)
        while reader.generation() < 2:
            pass
        got = reader.read()
        os.write(w, got[1] if got else b"none")
        os._exit(0)
    pub.publish(b"first", revision=1)
    pub.publish(b"second", revision=2)
    os.waitpid(pid, 0)
    assert os.read(r, 100) == b"second"


def test_store_state_is_said_with_its_reason_and_cleared(segment: Segment) -> None:
    pub, reader = SnapshotPublisher(segment.buf), SnapshotReader(segment.buf)
    assert reader.store_state() == (False, 0.0, "")
    pub.set_store_state(True, "store error: database or disk is full")
    failing, since, reason = reader.store_state()
    assert failing and since > 0 and reason == "store error: database or disk is full"
    pub.publish(b"doc", revision=1)  # publications leave it alone
    assert reader.store_state()[0]
    pub.set_store_state(True, "é" * 2000)  # cut to the reserved bytes, decoded without failing
    assert len(reader.store_state()[2].encode()) <= 1024
    pub.set_store_state(False)
    assert reader.store_state() == (False, 0.0, "")
    assert reader.read() == (1, b"doc")
