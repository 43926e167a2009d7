"""Tagged send/recv: requests on one tag, replies on another, in order."""

import numpy as np

import ferry
from _two_process import run, serve_until_closed

REQUEST, REPLY, COUNT = 1, 2, 5


def target(publish):
    with ferry.Engine() as engine:
        publish(engine.address)  # messages need no descriptor
        peer = engine.accept(timeout=60)
        inbox = engine.register(bytearray(256))
        outbox_buf = bytearray(256)
        outbox = engine.register(outbox_buf)
        for _ in range(COUNT):
            n = peer.recv(REQUEST, inbox).wait(timeout=10)
            reply = b"re: " + bytes(inbox.obj[:n])
            outbox_buf[: len(reply)] = reply
            peer.send(REPLY, outbox, length=len(reply)).wait(timeout=10)
        serve_until_closed(peer)


def initiator(address):
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        out = np.zeros(64, dtype=np.uint8)
        inbox = np.zeros(256, dtype=np.uint8)
        out_region, in_region = engine.register(out), engine.register(inbox)
        for i in range(COUNT):
            request = f"request {i}".encode()
            out[: len(request)] = np.frombuffer(request, dtype=np.uint8)
            reply = peer.recv(REPLY, in_region)  # posted before the request goes out
            peer.send(REQUEST, out_region, length=len(request)).wait(timeout=10)
            n = reply.wait(timeout=10)
            assert inbox[:n].tobytes() == b"re: " + request
        print(f"initiator: {COUNT} requests answered in order")


if __name__ == "__main__":
    run(target, initiator)
