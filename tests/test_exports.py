"""The public faces: each name exported once, shown under the module users import it from, documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC = ("trioq", "trioq.testing", "trioq.stores", "trioq.http")


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_exported_once_and_documented(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    for attribute in exported:
        obj = getattr(module, attribute)
        if isinstance(obj, str):  # a constant such as __version__
            continue
        assert inspect.getdoc(obj), f"{name}.{attribute} has no docstring"
        if inspect.isclass(obj) or inspect.isfunction(obj):
            shown = obj.__module__
            assert not any(part.startswith("_") for part in shown.split(".")), f"{name}.{attribute} shows {shown}"
            assert attribute in importlib.import_module(shown).__all__, f"{shown} does not export {attribute}"


def test_the_package_shows_its_names_as_its_own() -> None:
    import trioq

    for attribute in trioq.__all__:
        obj = getattr(trioq, attribute)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "trioq", (attribute, obj.__module__)
    assert repr(trioq.Job).startswith("<class 'trioq.Job'")
