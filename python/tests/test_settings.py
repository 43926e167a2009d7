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


def test_a_config_object_and_keywords_make_the_engine():
    c = ferry.Config()
    assert c.listen is True and c.transports[0] in ("verbs", "shm", "tcp")
    c.transports = ["tcp"]
    c.peer_timeout = 5.0
    c.connect_timeout = 5.0
    c.set("tcp.streams", 3)
    assert c.peer_timeout == 5.0
    assert c.settings()["tcp.streams"] == "3"
    target = ferry.Engine(c)
    # The keywords come after the config: an attribute, and a transport setting by keyword.
    initiator = ferry.Engine(c, listen=False, tcp_streams=2)
    try:
        peer = initiator.connect(target.address)
        assert peer.stats["channels"]["tcp"]["lanes"] == 3  # the listener's count holds
    finally:
        initiator.shutdown()
        target.shutdown()
    assert c.listen is True, "the engine took a copy: the caller's config is unchanged"
    with pytest.raises(ferry.InvalidArgument, match="peer_timeout must be >= 0"):
        c.peer_timeout = -1.0
    with pytest.raises(ferry.InvalidArgument, match="unknown transport"):
        c.transports = ["carrier-pigeon"]
    with pytest.raises(ferry.InvalidArgument, match=r"tcp.streams must be 1..64 \(is 0\)"):
        ferry.Engine(c, tcp_streams=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tcp_stream'"):
        ferry.Engine(c, tcp_stream=2)


def test_every_declared_setting_is_a_keyword():
    # <transport>_<name> for each one ferry.settings() lists, as set() takes it by name: nothing
    # to add per setting. Each is set to a value other than its default where it can be.
    for s in ferry.settings():
        if s["type"] == "bool":
            value = s["default"] != "true"
        elif s["type"] == "text":
            value = "elsewhere"
        else:
            value = s["range"].split("..")[0]  # the least it takes, as text
        by_keyword = ferry.Config(**{s["name"].replace(".", "_"): value})
        by_name = ferry.Config()
        by_name.set(s["name"], value)
        assert by_keyword.settings() == by_name.settings(), s["name"]
