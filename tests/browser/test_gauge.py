"""The live gauge page in a real headless Chromium (Debian's chromium and chromium-driver).

Its displayed rate follows rates sent to `ferry gauge` by UDP, and during a `ferry stream --web`
it agrees with the stream's own progress lines within 10 %. Screenshots go to $FERRY_ARTIFACTS
(gauge-udp.png, gauge-stream.png). Run by `make test-browser`.
"""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

FERRY = os.environ.get("FERRY", "build/release/tools/ferry")
ARTIFACTS = os.environ.get("FERRY_ARTIFACTS", ".")
# Waits for something to show, never a measurement: generous for a busy machine.
PATIENCE_S = 60
UNITS = {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9}


@pytest.fixture
def browser():
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def ferry(*args):
    return subprocess.Popen([FERRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def end(process):
    """Ctrl-C, then everything it printed."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=PATIENCE_S)
    return out, err


def displayed_rate(driver):
    value = driver.find_element(By.ID, "value").text
    unit = driver.find_element(By.ID, "unit").text
    return float(value) * UNITS[unit]


def only_its_own_resources(driver, url):
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    return all(name.startswith(url) for name in loaded), loaded


def test_the_page_follows_rates_sent_by_udp(browser):
    gauge = ferry("gauge", "--web", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--title", "test gauge")
    stop = threading.Event()
    try:
        m = re.match(r"gauge on (\S+) \(rates by UDP to (\S+):(\d+)\)", gauge.stdout.readline())
        assert m, "ferry gauge printed no address"
        url, host, port = m.group(1), m.group(2), int(m.group(3))
        browser.get(url)
        wait = WebDriverWait(browser, PATIENCE_S)
        wait.until(lambda d: d.find_element(By.ID, "title").text == "test gauge")
        assert displayed_rate(browser) == 0

        rate = {"value": "250MB/s"}
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

        def feed():
            while not stop.is_set():
                sender.sendto(rate["value"].encode(), (host, port))
                time.sleep(0.1)
        threading.Thread(target=feed, daemon=True).start()
        wait.until(lambda d: displayed_rate(d) == 250e6)
        rate["value"] = "1.25GB/s"
        wait.until(lambda d: displayed_rate(d) == 1.25e9)
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("live"))
        browser.save_screenshot(os.path.join(ARTIFACTS, "gauge-udp.png"))
        ok, loaded = only_its_own_resources(browser, url)
        assert ok, loaded
    finally:
        stop.set()
        out, err = end(gauge)
    assert gauge.returncode == 0, err


def test_the_page_shows_a_stream_at_the_rate_the_stream_reports(browser):
    with tempfile.TemporaryDirectory() as tmp:
        # A sink held to 40 MB/s: the rate stays put while the page is read.
        receiver = ferry("stream", "--listen", "127.0.0.1:0", "--web", "127.0.0.1:0", "--sink",
                         os.path.join(tmp, "out.bin"), "--sink-rate", "40MB/s", "--slot-bytes",
                         "256K", "--json", "--interval", "0.5")
        sender = None
        try:
            first = receiver.stdout.readline()
            assert first.startswith("listening on "), first
            sender = ferry("stream", "--connect", first.split()[-1], "--bytes", "2G")
            url = None
            while url is None:
                line = receiver.stdout.readline()
                assert line, "the receiver ended before it served a gauge"
                if line.startswith("gauge on "):
                    url = line.split()[2]
            browser.get(url)
            # The page starts at 0 and moves once the stream's rate arrives.
            WebDriverWait(browser, PATIENCE_S).until(lambda d: displayed_rate(d) > 0)
            shown = []
            for _ in range(16):  # four seconds of the page
                time.sleep(0.25)
                shown.append(displayed_rate(browser))
            browser.save_screenshot(os.path.join(ARTIFACTS, "gauge-stream.png"))
        finally:
            if sender is not None:
                end(sender)
            out, err = end(receiver)
    assert receiver.returncode == 0, err
    reported = [json.loads(l)["mb_per_s"] * 1e6 for l in out.splitlines()
                if '"kind":"progress"' in l]
    assert reported, out
    page, stream = statistics.median(shown), statistics.median(reported)
    assert abs(page - stream) <= 0.1 * stream, (shown, reported)
