"""GPU memory from Python against the CUDA stand-in (docs/gpu.md): Engine.allocate on a device,
DLPack exports of CUDA memory, transfers between them, and exports the driver contradicts.

The stand-in must be the process's libcuda.so.1 from its start, so each case runs in a child
interpreter with LD_LIBRARY_PATH set. `make test-python` passes FERRY_CUDA_STANDIN (the folder
holding the stand-in) and FERRY_REQUIRE_CUDA_STANDIN, so these cases cannot skip there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import ferry

STANDIN = os.environ.get("FERRY_CUDA_STANDIN", "")
if os.environ.get("FERRY_REQUIRE_CUDA_STANDIN"):
    assert os.path.exists(os.path.join(STANDIN, "libcuda.so.1")), STANDIN
needs_standin = pytest.mark.skipif(
    not os.path.exists(os.path.join(STANDIN, "libcuda.so.1")),
    reason="FERRY_CUDA_STANDIN names no stand-in libcuda.so.1")

# Child-side helpers: the driver through ctypes (the test's own view of device memory), and a
# DLPack capsule for any pointer and device, as a producer that may be wrong about either.
PRELUDE = textwrap.dedent("""
    import ctypes
    import ferry

    cu = ctypes.CDLL("libcuda.so.1")

    def check(result, call):
        assert result == 0, f"{call}: CUDA error {result}"

    def use_device(n):
        ctx = ctypes.c_void_p()
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), n), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def put(address, data):
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        check(cu.cuMemcpy(ctypes.c_uint64(address), ctypes.c_uint64(ctypes.addressof(buf)),
                             ctypes.c_size_t(len(data))), "cuMemcpy")

    def get(address, n):
        buf = ctypes.create_string_buffer(n)
        check(cu.cuMemcpy(ctypes.c_uint64(ctypes.addressof(buf)), ctypes.c_uint64(address),
                             ctypes.c_size_t(n)), "cuMemcpy")
        return buf.raw

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("byte_offset", ctypes.c_uint64)]

    class DLManagedTensor(ctypes.Structure):
        pass

    DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
    DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                                ("deleter", DELETER)]
    kept = []

    class Export:
        # __dlpack__ over `address` as one row of `n` bytes on (device_type, device_id).
        def __init__(self, address, n, device_type, device_id=0):
            self.args = (address, n, device_type, device_id)

        def __dlpack_device__(self):
            return self.args[2], self.args[3]

        def __dlpack__(self, **kwargs):
            address, n, device_type, device_id = self.args
            shape = (ctypes.c_int64 * 1)(n)
            m = DLManagedTensor()
            m.dl_tensor = DLTensor(address, DLDevice(device_type, device_id), 1,
                                   DLDataType(1, 8, 1), shape, None, 0)
            m.deleter = DELETER(0)
            kept.extend([shape, m])
            new = ctypes.pythonapi.PyCapsule_New
            new.restype = ctypes.py_object
            new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
            return new(ctypes.addressof(m), b"dltensor", None)

    def pair():
        target = ferry.Engine(peer_timeout=5.0, connect_timeout=5.0)
        initiator = ferry.Engine(peer_timeout=5.0, connect_timeout=5.0, listen=False)
        return target, initiator, initiator.connect(target.address)
""")


def run_child(body: str) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=STANDIN)
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_standin
def test_device_memory_moves_between_engines_and_through_dlpack():
    out = run_child("""
        target, initiator, peer = pair()
        n = (1 << 20) + 77
        src = initiator.allocate(n, memory="cuda:0")
        dst = target.allocate(n, ferry.Access.REMOTE_READ_WRITE, memory="cuda:1")
        assert (src.location, dst.location) == ("cuda:0", "cuda:1")
        assert src.obj.__dlpack_device__() == (2, 0), src.obj.__dlpack_device__()
        use_device(0)
        data = bytes((i * 7 + 3) % 251 for i in range(n))
        put(src.address, data)
        peer.write(src, dst.descriptor()).wait(20.0)
        assert get(dst.address, n) == data

        # A DLPack export of device memory registers as that device's memory, no copy made.
        again = target.register(dst.obj, ferry.Access.REMOTE_READ)
        assert again.location == "cuda:1" and again.address == dst.address
        back = initiator.allocate(n, memory="cuda:0")
        peer.read(back, again.descriptor(), local_offset=5, remote_offset=9,
                  length=n - 9).wait(20.0)
        assert get(back.address + 5, n - 9) == data[9:]
        print("moved", n)
    """)
    assert "moved" in out


@needs_standin
def test_device_memory_reaches_host_memory_at_a_peer_through_staging():
    run_child("""
        import numpy as np
        options = dict(peer_timeout=5.0, connect_timeout=5.0, transports=["tcp"],
                       staging_chunk_bytes=65536, staging_chunks=2)
        target = ferry.Engine(**options)
        initiator = ferry.Engine(listen=False, **options)
        peer = initiator.connect(target.address)
        n = (1 << 20) + 5
        device = initiator.allocate(n, memory="cuda:0")
        host = np.zeros(n, dtype=np.uint8)
        remote = target.register(host, ferry.Access.REMOTE_READ_WRITE)
        use_device(0)
        data = bytes((i * 13 + 1) % 256 for i in range(n))
        put(device.address, data)
        peer.write(device, remote.descriptor()).wait(20.0)
        assert host.tobytes() == data
        host[:] = 7
        peer.read(device, remote.descriptor()).wait(20.0)
        assert get(device.address, n) == bytes([7]) * n
    """)


@needs_standin
def test_exports_the_driver_contradicts_are_refused():
    run_child("""
        engine = ferry.Engine(listen=False)
        host = ctypes.create_string_buffer(4096)
        try:
            engine.register(Export(ctypes.addressof(host), 4096, 2, 0))
            raise SystemExit("a host pointer exported as CUDA memory registered")
        except ferry.InvalidArgument as e:
            assert "DLPack says the memory is on cuda:0 but the CUDA driver says host" in str(e), e
        device = engine.allocate(4096, memory="cuda:1")
        try:
            engine.register(Export(device.address, 4096, 2, 0))
            raise SystemExit("memory of cuda:1 exported as cuda:0 registered")
        except ferry.InvalidArgument as e:
            assert "on cuda:0 but the CUDA driver says cuda:1" in str(e), e
        try:
            engine.register(Export(ctypes.addressof(host), 4096, 4))
            raise SystemExit("OpenCL memory registered")
        except ferry.Unsupported as e:
            assert "DLPack device type 4 cannot be registered" in str(e), e
        # Pinned host memory (kDLCUDAHost) is host memory the CPU reaches.
        pinned = engine.register(Export(ctypes.addressof(host), 4096, 3))
        assert pinned.location == "host"
    """)


def test_unknown_memory_is_refused_by_name():
    engine = ferry.Engine(listen=False)
    for bad in ("gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0 "):
        with pytest.raises(ferry.InvalidArgument, match="expected host, cuda or cuda:N"):
            engine.allocate(4096, memory=bad)
    engine.shutdown()
