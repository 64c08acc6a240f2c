"""Public names show where users import them from, as trio's do: ``trioq.Job``, not ``trioq._model.Job``."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["show_as_public"]


def show_as_public(module: str, namespace: Mapping[str, object]) -> None:
    """Set ``__module__`` of the public names in ``namespace`` (and of their classes' members) to ``module``.

    Only objects defined in a trioq module other than ``module`` are touched,
    so a name two public modules export (``trioq.stores.MemoryStore`` is
    ``trioq.MemoryStore`` too) ends up with the one imported last: the
    package itself, whose ``__init__`` imports its subpackages first.
    Pickles stay loadable: every name so shown is importable from ``module``.
    """
    seen: set[int] = set()

    def show(obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        home = getattr(obj, "__module__", None)
        if not isinstance(home, str) or not home.startswith("trioq.") or home == module:
            return
        try:
            obj.__module__ = module
        except (AttributeError, TypeError):  # a builtin or slotted object: leave it
            return
        if isinstance(obj, type):
            for member in list(vars(obj).values()):
                show(member)

    for name, obj in namespace.items():
        if not name.startswith("_"):
            show(obj)
