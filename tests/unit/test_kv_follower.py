"""The host's KV-event subscription over real ZeroMQ sockets on loopback (``KVEventFollower``): a
publisher that sends frames that are not vLLM's, and one message larger than the follower takes, does not
end the subscription; each costs the backend its exact pairs (a gap), and the next good batch is mirrored."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from gateway.controlplane.fleet.kv_events import MAX_MESSAGE, KVEventFollower
from gateway.native import PrefixIndex
from gateway.protocol.kv_events import BlockStored, EventBatch, encode_message
from gateway.snapshot import Backend
from tests.fixtures.processes import free_port


async def until(check: object, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def test_hostile_messages_cost_the_exact_pairs_not_the_subscription() -> None:
    async def run() -> None:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        context = zmq.asyncio.Context()
        pub = context.socket(zmq.PUB)
        pub.bind(endpoint)
        follower = KVEventFollower(PrefixIndex.private(1 << 12))
        follower.follow({"e": Backend("e", "http://e", None, "openai", 1, 1, 1, kv_events=endpoint)})
        try:
            await until(lambda: follower.counts()["e"]["connected"], "the subscription connects")
            sequence = 0

            async def good() -> None:
                nonlocal sequence
                sequence += 1
                block = BlockStored((sequence,), None, tuple(range(16 * sequence, 16 * sequence + 16)), 16)
                await pub.send_multipart(list(encode_message(b"kv", sequence, EventBatch(1.0, (block,), 0))))

            # A publisher's first messages can be lost while the subscription settles: send until one lands.
            async def mirrored(blocks: int) -> bool:
                for _ in range(250):
                    await good()
                    await asyncio.sleep(0.02)
                    if follower.counts()["e"]["blocks"] >= blocks:
                        return True
                return False

            assert await mirrored(1)
            counts = follower.counts()["e"]
            for frames in ([b"kv", b"short", b"x"], [b"kv"], [b"kv", (1).to_bytes(8, "big"), b"\xc1\xff"]):
                await pub.send_multipart(frames)
            await until(lambda: follower.counts()["e"]["undecodable"] >= counts["undecodable"] + 3, "counted")
            assert follower.counts()["e"]["blocks"] == 0  # each bad message voids what was known
            # A message past MAX_MESSAGE: ZeroMQ drops the connection, which forgets too and reconnects.
            await pub.send_multipart([b"kv", (2).to_bytes(8, "big"), b"\x00" * (MAX_MESSAGE + 1)])
            assert await mirrored(1), "a new socket took good batches again"
            assert follower.counts()["e"]["gaps"] >= 3
        finally:
            await follower.aclose()
            pub.close(0)
            context.term()

    asyncio.run(run())
