"""Discovery through a real etcd (Debian's etcd-server): publish, resolve, connect and watch by
name from Python, with bytes compared and each refusal's exception class checked."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

import ferry
from conftest import WAIT, config

ETCD = "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    if shutil.which(ETCD) is None:
        pytest.fail(f"{ETCD} is missing: scripts/install-deps.sh test installs etcd-server")
    data = tmp_path_factory.mktemp("etcd")
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [ETCD, "--name=py", f"--data-dir={data}/data", f"--listen-client-urls={client}",
         f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
         f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=py={peer}",
         "--logger=zap", f"--log-outputs={data}/etcd.log", "--log-level=warn"])
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(client + "/health", timeout=1).read()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(f"etcd did not start (see {data}/etcd.log)")
            time.sleep(0.05)
    yield client
    process.terminate()
    process.wait(30)


@pytest.fixture
def named(etcd, request):
    """Engine keywords for discovery, each test under a prefix of its own."""
    return config(etcd=etcd, etcd_prefix=f"py/{request.node.name}/", etcd_ttl=2.0)


def test_publish_resolve_connect_and_write_by_name(named):
    target = ferry.Engine(**named)
    initiator = ferry.Engine(**named)
    memory = np.zeros(4096, np.uint8)
    region = target.register(memory, access=ferry.Access.REMOTE_WRITE)
    target.publish("prefill-0")
    region.publish("kv")

    found = initiator.resolve("prefill-0")
    assert (found.name, found.engine_id, found.incarnation) == (
        "prefill-0", target.id, target.incarnation)
    assert found.present and found.addresses == target.addresses
    assert found.public_key == target.public_key

    peer = initiator.connect_named("prefill-0")
    assert peer.engine_id == target.id
    kv = peer.region_named("kv")
    assert isinstance(kv, ferry.Descriptor) and kv.to_string() == region.to_string()
    source = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    local = initiator.register(source)
    peer.write(local, kv).wait(WAIT)
    assert np.array_equal(memory, source)
    initiator.shutdown()
    target.shutdown()


def test_refusals_raise_their_own_classes(named):
    first = ferry.Engine(**named)
    second = ferry.Engine(**named)
    first.publish("decode-0")
    with pytest.raises(ferry.AlreadyExists):
        second.publish("decode-0")
    with pytest.raises(ferry.NotFound):
        second.resolve("nobody")
    with pytest.raises(ferry.NotFound):
        second.connect_named("nobody")
    with pytest.raises(ferry.NotFound):
        second.connect(first.address).region_named("none")
    with pytest.raises(ferry.InvalidArgument):
        first.publish("not/a name")
    without = ferry.Engine(**config())
    with pytest.raises(ferry.Unsupported):
        without.resolve("decode-0")
    first.shutdown()  # frees the name at once
    second.publish("decode-0")
    assert second.resolve("decode-0").engine_id == second.id
    second.shutdown()
    without.shutdown()


def test_a_watch_reports_the_entry_and_its_changes(named):
    watcher = ferry.Engine(**named)
    seen = []
    changed = threading.Condition()

    def on_change(entry):
        with changed:
            seen.append(entry)
            changed.notify_all()

    with watcher.watch("svc", on_change):
        with changed:
            assert changed.wait_for(lambda: len(seen) == 1, WAIT)
        assert not seen[0].present and seen[0].engine_id == 0
        target = ferry.Engine(**named)
        target.publish("svc")
        with changed:
            assert changed.wait_for(lambda: len(seen) == 2, WAIT)
        assert seen[1].present and seen[1].engine_id == target.id
        target.shutdown()
        with changed:
            assert changed.wait_for(lambda: len(seen) == 3, WAIT)
        assert not seen[2].present
    watcher.shutdown()
