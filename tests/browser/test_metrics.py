"""/metrics of `ferry stream --web`, read by prometheus_client's text parser.

The sender streams bytes the test writes to its standard input; once the receiver has them all,
the sender's write_with_imm bytes are exactly those bytes plus one 16-byte slot header per chunk
(the receiver's count), an operation carries one to four chunks (a run, while the sender is
ahead), and the receiver counted one notification per operation. Run by `make test-browser`.
"""
import json
import os
import signal
import subprocess
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

FERRY = os.environ.get("FERRY", "build/release/tools/ferry")
PATIENCE_S = 60  # waits for something to happen, never a measurement
SLOT_HEADER_BYTES = 16  # tools/ferry/stream.cpp, SlotHeader
SLOT_BYTES = 1 << 20  # the receiver's default, its header included
MAX_RUN = 4  # chunks one write_with_imm carries at most (stream.cpp, kMaxRun)
# Printable, so that it passes through a text pipe unchanged.
PAYLOAD = "".join(chr(33 + (i * 7 + i // 251) % 90) for i in range((5 << 20) + 123))


def ferry(*args, **kwargs):
    return subprocess.Popen([FERRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def line_starting(process, prefix):
    while True:
        line = process.stdout.readline()
        assert line, f"{prefix!r} never came: {process.stderr.read()}"
        if line.startswith(prefix):
            return line


def scrape(url):
    """Every sample of the page as (name, labels, value)."""
    with urllib.request.urlopen(url + "metrics", timeout=PATIENCE_S) as page:
        assert page.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = page.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def value(samples, name, **labels):
    """The sum of the samples of `name` with these labels (over the peer's transports)."""
    found = [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items())]
    assert found, (name, labels)
    return sum(found)


def test_metrics_count_the_bytes_the_stream_moved():
    receiver = ferry("stream", "--listen", "127.0.0.1:0", "--sink", "discard", "--web",
                     "127.0.0.1:0", "--json", "--interval", "0.2")
    sender = None
    try:
        address = line_starting(receiver, "listening on ").split()[-1]
        sender = ferry("stream", "--connect", address, "--source", "-", "--web", "127.0.0.1:0",
                       stdin=subprocess.PIPE)
        sender_url = line_starting(sender, "gauge on ").split()[2]
        receiver_url = line_starting(receiver, "gauge on ").split()[2]
        for at in range(0, len(PAYLOAD), 1 << 16):
            sender.stdin.write(PAYLOAD[at:at + (1 << 16)])
        sender.stdin.flush()
        # The stream stays open (stdin is): wait until the receiver has every byte.
        while True:
            line = receiver.stdout.readline()
            assert line, receiver.stderr.read()
            if line.startswith("{") and json.loads(line)["total_bytes"] == len(PAYLOAD):
                chunks = json.loads(line)["chunks"]
                break
        # Its last write may still be finishing at the sender: in flight, and counted once it
        # completes. (Its receives for the receiver's credits stay in flight.)
        deadline = time.monotonic() + PATIENCE_S
        while True:
            sent = scrape(sender_url)
            if (value(sent, "ferry_in_flight_operations", kind="write_with_imm") == 0
                    or time.monotonic() > deadline):
                break
            time.sleep(0.05)
        received = scrape(receiver_url)
    finally:
        if sender is not None:
            sender.stdin.close()
            sender.wait(timeout=PATIENCE_S)
        receiver.send_signal(signal.SIGINT)
        receiver.communicate(timeout=PATIENCE_S)

    assert sender.returncode == 0, sender.stderr.read()
    kind = {"kind": "write_with_imm"}
    assert value(sent, "ferry_in_flight_operations", **kind) == 0
    writes = value(sent, "ferry_operations_total", outcome="succeeded", **kind)
    assert not [l for n, l, _ in sent if n == "ferry_errors_total"]
    assert chunks >= len(PAYLOAD) / (SLOT_BYTES - SLOT_HEADER_BYTES)
    assert chunks / MAX_RUN <= writes <= chunks
    assert value(sent, "ferry_bytes_total", **kind) == len(PAYLOAD) + SLOT_HEADER_BYTES * chunks
    assert value(sent, "ferry_operation_latency_seconds_count", **kind) == writes
    assert value(sent, "ferry_operation_latency_seconds_bucket", le="+Inf", **kind) == writes
    assert value(sent, "ferry_operation_latency_seconds_sum", **kind) > 0
    assert value(sent, "ferry_peers") == 1
    assert value(received, "ferry_imms_received_total") == writes
    assert value(received, "ferry_peers_admitted_total") == 1
    assert [n for n, _, _ in received if n == "ferry_gauge_rate_bytes_per_second"]
