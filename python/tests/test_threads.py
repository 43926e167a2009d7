"""Blocking calls release the GIL; callbacks re-acquire it, and their exceptions are reported."""

from __future__ import annotations

import sys
import threading

import numpy as np

import ferry
from conftest import WAIT


def test_other_python_threads_run_during_a_blocking_wait(pair):
    inbox = pair.target.register(np.zeros(8, np.uint8))
    pending = pair.target_peer.recv(4, inbox)
    counted = threading.Event()
    count = 0

    def spin():
        nonlocal count
        while count < 100_000:  # pure Python: runs only while the waiter released the GIL
            count += 1
        counted.set()

    def send_after_counting():
        counted.wait(WAIT)
        pair.peer.send(4, pair.initiator.register(np.ones(8, np.uint8))).wait(WAIT)

    threads = [threading.Thread(target=spin), threading.Thread(target=send_after_counting)]
    for t in threads:
        t.start()
    # The message is sent only once the other thread counted to the end, so this wait can only
    # finish if the GIL was free meanwhile.
    assert pending.wait(WAIT) == 8
    for t in threads:
        t.join()
    assert count == 100_000


def test_callbacks_run_once_and_their_exceptions_are_reported(pair, monkeypatch):
    region = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(64, np.uint8))
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    calls = []
    done = threading.Event()

    def fails(future):
        calls.append(("fails", future.bytes))
        raise RuntimeError("raised in a callback")

    def records(future):
        calls.append(("records", future.bytes))
        done.set()

    f = pair.peer.write(local, region.descriptor())
    f.add_done_callback(fails)
    f.add_done_callback(records)
    assert done.wait(WAIT)
    f.wait(WAIT)
    late = []
    f.add_done_callback(lambda g: late.append(g.done()))  # already done: runs at once
    assert late == [True]
    assert sorted(calls) == [("fails", 64), ("records", 64)]
    assert any(isinstance(e, RuntimeError) and "raised in a callback" in str(e) for e in reported)


def test_on_imm_callback_from_a_ferry_thread(pair):
    region = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(64, np.uint8))
    got = []
    arrived = threading.Event()

    def on_imm(event):
        got.append((event.imm, threading.current_thread() is threading.main_thread()))
        if len(got) == 3:
            arrived.set()

    pair.target.on_imm(on_imm)
    for imm in range(3):
        pair.peer.write_with_imm(local, region.descriptor(), imm).wait(WAIT)
    assert arrived.wait(WAIT)
    assert sorted(g[0] for g in got) == [0, 1, 2]
    pair.target.on_imm(None)  # back to the queue
    pair.peer.write_with_imm(local, region.descriptor(), 7).wait(WAIT)
    assert pair.target.next_imm(WAIT).imm == 7


def test_many_threads_post_on_one_peer(pair):
    remote = np.zeros((8, 4096), np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_READ_WRITE)
    errors = []

    def worker(i):
        try:
            src = np.full(4096, i + 1, np.uint8)
            local = pair.initiator.register(src)
            for _ in range(50):
                pair.peer.write(local, region.descriptor(), remote_offset=i * 4096).wait(WAIT)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all((remote[i] == i + 1).all() for i in range(8))
