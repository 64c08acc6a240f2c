"""The README's promises: its embedding example runs, and its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_embedding_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 25
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 5
    assert all(line.startswith("succeeded") for line in lines)
    assert lines[3].startswith("succeeded 2 ")  # 3.png failed once and was retried


def test_readme_commands_are_the_contract() -> None:
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]" && trioq demo' in readme
    assert 'pip install -e ".[dev]" && pytest' in readme


@pytest.mark.slow
def test_trioq_demo_runs_kills_the_server_and_loses_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioq", "demo", "--jobs", "200"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kill -9 after" in proc.stdout
    assert re.search(r"jobs acknowledged by the server\s+200\n", proc.stdout)
    assert re.search(r"acknowledged but unfinished \(must be 0\)\s+0\n", proc.stdout)
    assert "every acknowledged job finished" in proc.stdout


def test_testing_guide_shows_the_example_tests_as_they_are() -> None:
    # docs/testing.md quotes examples/test_shop.py (which tests/test_plugin.py runs):
    # every quoted test exists there, and every quoted line is one of its lines.
    guide = (ROOT / "docs" / "testing.md").read_text()
    example = {line.strip() for line in (ROOT / "examples" / "test_shop.py").read_text().splitlines()}
    blocks = [b for b in re.findall(r"```python\n(.*?)```", guide, flags=re.S) if "async def test_" in b]
    assert len(blocks) >= 5
    for block in blocks:
        for name in re.findall(r"async def (test_\w+)", block):
            assert any(line.startswith(f"async def {name}(") for line in example), name
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "async def ", "@pytest")):
                assert line in example, line
