"""The torch.distributed backend "ferry" under torchrun: four ranks, every operation checked
against gloo in the same job (distributed_worker.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # conftest requires it under make test

WORKER = Path(__file__).with_name("distributed_worker.py")


def run_ranks(ranks: int, extra_env: dict[str, str] | None = None) -> str:
    env = dict(os.environ, **(extra_env or {}))
    # Debian's torch 1.13 cannot parse torchrun's default --redirects 0 under Python 3.11 (its
    # Std flag 0 is no member to iterate): 2 (stderr to a file) is one it can, teed back here.
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={ranks}", "--redirects=2", "--tee=2", str(WORKER)],
        capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    return done.stdout


@pytest.mark.parametrize("transports", ["shm,tcp", "tcp"])
def test_torchrun_four_ranks_match_gloo(transports):
    out = run_ranks(4, {"FERRY_TRANSPORTS": transports})
    assert sorted(re.findall(r"rank \d ok", out)) == [f"rank {r} ok" for r in range(4)]
