"""Every example in examples/python runs green as two processes; the package type-checks."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("[!_]*.py")))
def test_example_runs(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                          timeout=300, cwd=EXAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), "an example says what it did"
    if os.environ.get("FERRY_REQUIRE_TORCH"):
        assert "skipped" not in done.stdout, done.stdout


def test_examples_and_package_type_check():
    mypy = pytest.importorskip("mypy.api")
    for target in (["-p", "ferry"], sorted(str(p) for p in EXAMPLES.glob("*.py"))):
        stdout, stderr, status = mypy.run(
            ["--ignore-missing-imports", "--no-error-summary", *target])
        assert status == 0, stdout + stderr


def test_readme_python_blocks_run():
    readme = (EXAMPLES.parents[1] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    assert blocks, "the README shows Python"
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, block + done.stderr
