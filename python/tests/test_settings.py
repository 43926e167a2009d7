"""Transport settings by name: ferry.settings() lists them, Engine(settings=...) sets them."""

from __future__ import annotations

import pytest

import ferry

from conftest import config


def test_every_setting_is_listed_with_its_range_and_variable():
    listed = {s["name"]: s for s in ferry.settings()}
    streams = listed["tcp.streams"]
    assert streams["type"] == "count"
    assert streams["range"] == "1..64"
    assert streams["environment"] == "FERRY_TCP_STREAMS"
    assert streams["help"]
    assert listed["shm.stream_poll"]["type"] == "duration"


def test_settings_reach_the_engine_and_bad_ones_are_refused():
    kw = config(transports=["tcp"])
    target = ferry.Engine(**kw, settings={"tcp.streams": 3, "shm.stream_poll": "50us",
                                           "shm.cross_memory": False})
    initiator = ferry.Engine(**config(listen=False, transports=["tcp"]))
    try:
        peer = initiator.connect(target.address)
        assert peer.stats["channels"]["tcp"]["lanes"] == 3  # the listener's count holds for both
    finally:
        initiator.shutdown()
        target.shutdown()
    with pytest.raises(ferry.InvalidArgument, match=r"tcp.streams must be 1..64 \(is 0\)"):
        ferry.Engine(**kw, settings={"tcp.streams": 0})
    with pytest.raises(ferry.InvalidArgument, match="no setting named 'tcp.stream'"):
        ferry.Engine(**kw, settings={"tcp.stream": 2})
    with pytest.raises(TypeError, match=r"settings\['tcp.streams'\]: a str, int or bool"):
        ferry.Engine(**kw, settings={"tcp.streams": 2.5})
