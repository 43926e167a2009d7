"""Ferry's log records reach Python's logging module under the "ferry" logger."""

from __future__ import annotations

import logging
import time

import pytest

import ferry

from conftest import WAIT, config


@pytest.fixture
def info_level():
    before = ferry.log_level()
    ferry.set_log_level("info")
    yield
    ferry.set_log_level(before)


def wait_for(caplog, text: str) -> list[logging.LogRecord]:
    # Records come through a queue and the package's thread: wait, generously, for them.
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [r for r in caplog.records if text in r.getMessage()]
        if found:
            return found
        time.sleep(0.01)
    return []


def test_levels_are_set_and_read():
    before = ferry.log_level()
    try:
        for name in ("off", "error", "warn", "info", "debug", "trace"):
            ferry.set_log_level(name)
            assert ferry.log_level() == name
        ferry.set_log_level("warning")
        assert ferry.log_level() == "warn"
        with pytest.raises(ValueError, match="log level 'loud'"):
            ferry.set_log_level("loud")
        assert ferry.log_level() == "warn"
    finally:
        ferry.set_log_level(before)


def test_the_routes_of_a_peer_are_an_info_record_of_ferry_engine(caplog, info_level):
    caplog.set_level(logging.INFO, logger="ferry")
    target = ferry.Engine(**config(transports=["tcp"]))
    initiator = ferry.Engine(**config(listen=False, transports=["tcp"]))
    try:
        initiator.connect(target.address)
        found = wait_for(caplog, "(same process, we connected): write/read over tcp (tcp: chosen")
        assert len(found) == 1
        assert found[0].name == "ferry.engine"
        assert found[0].levelno == logging.INFO
        assert f"peer {target.id} at " in found[0].getMessage()
    finally:
        initiator.shutdown()
        target.shutdown()


def test_a_refused_handshake_is_a_warning_of_ferry_listener(caplog):
    caplog.set_level(logging.WARNING, logger="ferry")
    target = ferry.Engine(**config(transports=["tcp"], secret="s3cret"))
    initiator = ferry.Engine(**config(listen=False, transports=["tcp"]))
    try:
        with pytest.raises(ferry.FerryError):
            initiator.connect(target.address)
        found = wait_for(caplog, "refused: ")
        assert found, [r.getMessage() for r in caplog.records]
        assert found[0].name == "ferry.listener"
        assert found[0].levelno == logging.WARNING
    finally:
        initiator.shutdown()
        target.shutdown()
