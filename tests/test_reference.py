"""docs/reference.md is what docs/make_reference.py writes now, and every public name has a docstring."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "make_reference.py"
REFERENCE = ROOT / "docs" / "reference.md"

#: Public methods and properties known to lack a docstring. The list may only shrink: a name
#: that gains a docstring must leave it, and no new name may join it.
KNOWN_UNDOCUMENTED: set[str] = set()


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_reference_is_what_the_script_writes() -> None:
    # A fresh interpreter, as a user runs it: nothing the test session imported can change the page.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr


def test_every_public_name_has_a_docstring() -> None:
    script = load_script()
    undocumented = set(script.render().undocumented)
    exported = set(script.MODULES) | {
        f"{module}.{name}" for module in script.MODULES for name in importlib.import_module(module).__all__
    }
    assert not undocumented & exported, f"public names without a docstring: {sorted(undocumented & exported)}"
    members = undocumented - exported
    assert not members - KNOWN_UNDOCUMENTED, f"methods or properties without a docstring: {sorted(members)}"
    gained = KNOWN_UNDOCUMENTED - members
    assert not gained, f"these have a docstring now: drop them from KNOWN_UNDOCUMENTED: {sorted(gained)}"


def test_reference_covers_every_public_name_and_holds_no_address() -> None:
    script = load_script()
    text = REFERENCE.read_text()
    for module in script.MODULES:
        assert f"## `{module}`\n" in text, module
        for name in importlib.import_module(module).__all__:
            assert f"### `{module}.{name}`\n" in text, f"{module}.{name}"
    assert not re.search(r"0x[0-9a-f]{6,}", text), "a memory address in docs/reference.md"
    assert str(ROOT) not in text
