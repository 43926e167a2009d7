"""Objects without the buffer protocol register through DLPack (torch tensors, JAX arrays)."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from conftest import WAIT


class DLPackOnly:
    """Exposes an array through __dlpack__ alone, as a torch tensor does."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_object_registers_without_copy(pair):
    backing = np.zeros((64, 64), dtype=np.float32)
    remote = pair.target.register(DLPackOnly(backing), access=ferry.Access.REMOTE_WRITE)
    assert remote.address == backing.ctypes.data and remote.size == backing.nbytes
    src = np.arange(64 * 64, dtype=np.float32)
    pair.peer.write(pair.initiator.register(DLPackOnly(src)), remote.descriptor()).wait(WAIT)
    assert np.array_equal(backing.ravel(), src)


def test_non_contiguous_dlpack_is_refused(pair):
    with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
        pair.initiator.register(DLPackOnly(np.zeros((16, 16), np.float32)[:, ::2]))


def test_torch_tensors_when_installed(pair):
    torch = pytest.importorskip("torch")
    target = torch.zeros(1024, dtype=torch.bfloat16)
    remote = pair.target.register(target, access=ferry.Access.REMOTE_WRITE)
    src = torch.arange(1024, dtype=torch.bfloat16)
    pair.peer.write(pair.initiator.register(src), remote.descriptor()).wait(WAIT)
    assert torch.equal(target, src)
    offsets = torch.arange(4, dtype=torch.int64) * 512
    pair.peer.write(pair.initiator.register(src), remote.descriptor(), local_offset=offsets,
                    remote_offset=offsets, length=256).wait(WAIT)
