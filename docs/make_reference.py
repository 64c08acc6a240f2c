"""Write ``docs/reference.md``: every public name of trioq, with its signature and docstring.

Run from the repository root::

    python docs/make_reference.py            # rewrite docs/reference.md
    python docs/make_reference.py --check    # exit 1 if docs/reference.md is stale

The public faces are the modules in ``MODULES``; a module's public names are its
``__all__``. Each function is shown with its signature; each class with its
constructor, its bases, and its public methods and properties (its own first,
in source order, then those it inherits from other trioq classes). Docstrings
are reStructuredText-flavoured: the few constructs they use are turned into
Markdown (``literal`` and :role:`name` into code spans, ``::`` into ``:``).
A name exported by two modules is documented once, under the first, and the
second points to it. Plain Python and ``inspect``: no dependency beyond
trioq's own extras (``http`` and ``client``, which ``trioq.http`` and
``trioq.client`` import).

The output is stable: no memory addresses, no absolute paths, nothing that
depends on the order in which modules were imported. ``tests/test_reference.py``
fails when ``docs/reference.md`` is not what this script writes now, and when a
public name, method or property has no docstring.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import enum
import functools
import importlib
import inspect
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference.md"

#: The public faces, in the order the page shows them.
MODULES = ("trioq", "trioq.testing", "trioq.http", "trioq.client", "trioq.stores")

#: Dunder methods worth a line: what a class supports, not how it is built.
PROTOCOLS = {
    "__enter__": "`with`",
    "__aenter__": "`async with`",
    "__iter__": "iteration",
    "__aiter__": "`async for`",
    "__len__": "`len()`",
    "__contains__": "`in`",
    "__call__": "calling",
}

#: Signatures longer than this are written one parameter a line.
WIDTH = 100

_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")


@dataclass
class Page:
    """What rendering found: the Markdown lines, and the names that lack a docstring."""

    lines: list[str] = field(default_factory=list)
    undocumented: list[str] = field(default_factory=list)
    seen: dict[int, str] = field(default_factory=dict)  # id(object) -> where it is documented
    protocols: dict[type, str] = field(default_factory=dict)  # public typing.Protocol -> its qualified name

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)


# -- docstrings ------------------------------------------------------------------------------------


def own_doc(obj: Any) -> str | None:
    """``obj``'s own docstring (a class's is not inherited), cleaned; ``None`` if it has none."""
    if obj is None:
        return None
    if isinstance(obj, property | functools.cached_property):
        obj = obj.fget if isinstance(obj, property) else obj.func
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def _role(match: re.Match[str]) -> str:
    """``:class:`~trioq.Job``` -> ````Job````; ``:meth:`Store.complete``` -> ````Store.complete````."""
    tilde, target = match.groups()
    return f"``{target.rsplit('.', 1)[-1] if tilde else target}``"


def markdown(doc: str) -> str:
    """A reST-flavoured docstring as Markdown: code spans, roles, ``::``, and ``<`` escaped outside code."""
    doc = re.sub(r":[a-z]+:`(~?)([^`]+)`", _role, doc)
    out: list[str] = []
    in_block = False
    previous_blank = True
    for line in doc.splitlines():
        if line.startswith("    ") and (previous_blank or in_block):
            in_block = True
            out.append(line)
            previous_blank = False
            continue
        if line.strip():
            in_block = False
        previous_blank = not line.strip()
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        parts = re.split(r"(``.+?``)", line)
        for i, part in enumerate(parts):
            if i % 2:
                parts[i] = "`" + part[2:-2] + "`"
            else:
                parts[i] = part.replace("<", "&lt;")
        out.append("".join(parts))
    return "\n".join(out)


def comment_doc(module: types.ModuleType, name: str) -> str | None:
    """The ``#:`` comment above ``name``'s assignment in the module that ``module`` imports it from."""
    source = inspect.getsource(module)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            home = importlib.import_module("." * node.level + (node.module or ""), module.__package__ or None)
            lines = inspect.getsource(home).splitlines()
            for number, line in enumerate(lines):
                if re.match(rf"{re.escape(name)}\s*[:=]", line):
                    comments = []
                    for above in reversed(lines[:number]):
                        if not above.startswith("#:"):
                            break
                        comments.append(above[2:].strip())
                    return " ".join(reversed(comments)) or None
    return None


# -- signatures ------------------------------------------------------------------------------------


def annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value
    return inspect.formatannotation(value)


def default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return _ADDRESS.sub("", repr(value))


def parameters(sig: inspect.Signature, *, drop_first: bool) -> list[str]:
    params = list(sig.parameters.values())
    if drop_first and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    out: list[str] = []
    star_done = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star_done:
            out.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {annotation(p.annotation)}"
            if p.default is not p.empty:
                text += f" = {default(p.default)}"
        elif p.default is not p.empty:
            text += f"={default(p.default)}"
        out.append(text)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            out.append("/")
    return out


def signature_line(head: str, params: list[str], returns: str) -> str:
    tail = f" -> {returns}" if returns else ""
    one = f"{head}({', '.join(params)}){tail}"
    if len(one) <= WIDTH or not params:
        return one
    inner = "".join(f"    {p},\n" for p in params)
    return f"{head}(\n{inner}){tail}"


def safe_signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError, NameError):
        return None


def struct_signature(cls: type) -> inspect.Signature | None:
    """A msgspec Struct's constructor, from its fields (its own ``__signature__`` evaluates annotations)."""
    fields = getattr(cls, "__struct_fields__", None)
    if fields is None:
        return None
    defaults = cls.__struct_defaults__  # type: ignore[attr-defined]
    first_default = len(fields) - len(defaults)
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        hints.update(inspect.get_annotations(klass))
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # trioq declares no kw_only struct
    params = []
    for i, name in enumerate(fields):
        value = defaults[i - first_default] if i >= first_default else inspect.Parameter.empty
        value = struct_default(value)
        params.append(inspect.Parameter(name, kind, default=value, annotation=hints.get(name, inspect.Parameter.empty)))
    return inspect.Signature(params)


class _Factory:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def struct_default(value: Any) -> Any:
    factory = getattr(value, "factory", None)
    if type(value).__name__ == "Factory" and factory is not None:
        return _Factory(f"{getattr(factory, '__name__', 'factory')}()")
    return value


def function_block(name: str, obj: Any, *, method: bool) -> str:
    """``obj`` as its ``def`` line(s), decorators that change how it is called included."""
    decorators = []
    target = obj
    if isinstance(obj, staticmethod | classmethod):
        decorators.append(f"@{type(obj).__name__}")
        target = obj.__func__
    wrapped = getattr(target, "__wrapped__", None)
    prefix = "def"
    if wrapped is not None and inspect.isasyncgenfunction(wrapped):
        decorators.append("@asynccontextmanager")
        prefix = "async def"
    elif wrapped is not None and inspect.isgeneratorfunction(wrapped):
        decorators.append("@contextmanager")
    elif inspect.iscoroutinefunction(target):
        prefix = "async def"
    sig = safe_signature(wrapped if wrapped is not None and decorators else target)
    if sig is None:
        sig = safe_signature(target)
    drop = method and not isinstance(obj, staticmethod)
    params = parameters(sig, drop_first=drop) if sig is not None else ["..."]
    returns = annotation(sig.return_annotation) if sig is not None else ""
    return "\n".join([*decorators, signature_line(f"{prefix} {name}", params, returns)])


# -- classes ---------------------------------------------------------------------------------------


def is_trioq(cls: type) -> bool:
    return cls.__module__ == "trioq" or cls.__module__.startswith("trioq.")


def is_public(cls: type) -> bool:
    """Whether ``cls`` is one of trioq's public names (``show_as_public`` gave it a public module)."""
    return cls.__module__ in MODULES and not cls.__name__.startswith("_")


def base_names(cls: type) -> list[str]:
    """``cls``'s bases as a reader imports them; trioq's private bases are left out."""
    out = []
    for base in cls.__bases__:
        if base is object or base.__name__.startswith("_") or (is_trioq(base) and not is_public(base)):
            continue
        if is_trioq(base) or base.__module__ == "builtins":
            out.append(f"`{base.__name__}`")
        else:
            out.append(f"`{base.__module__.split('.')[0]}.{base.__qualname__}`")
    return out


def class_signature(cls: type) -> str:
    """``class Name(params)``: how the class is constructed (just ``class Name`` when that says nothing)."""
    head = f"class {cls.__name__}"
    if issubclass(cls, enum.Enum):
        return head
    sig = struct_signature(cls)
    if sig is None:
        init = next((k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__), None)
        if init is None or not is_trioq_function(init, cls):
            return head
        sig = safe_signature(cls)
    if sig is None or not sig.parameters:
        return head
    return signature_line(head, parameters(sig, drop_first=False), "")


def is_trioq_function(init: Any, cls: type) -> bool:
    """Whether ``__init__`` is trioq's own (or attrs' generated one for a trioq class), not a builtin's."""
    module = getattr(init, "__module__", None) or ""
    if module == "trioq" or module.startswith("trioq."):
        return True
    # attrs generates __init__ in a module of its own ("attrs generated init ...").
    return "attrs generated" in (getattr(getattr(init, "__code__", None), "co_filename", "") or "")


def members(cls: type) -> Iterator[tuple[str, Any, type]]:
    """Public methods and properties of ``cls`` and of its trioq bases: own first, each in source order."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is not cls and not is_trioq(klass):
            continue
        for name, value in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_"):
                continue
            if isinstance(value, types.MemberDescriptorType | types.GetSetDescriptorType):
                continue  # a slot (an attrs or msgspec field): the constructor shows it
            if isinstance(value, enum.Enum):
                continue
            yield name, value, klass


def protocols(cls: type) -> list[str]:
    found = []
    for dunder, what in PROTOCOLS.items():
        owner = next((k for k in cls.__mro__ if dunder in k.__dict__), None)
        if owner is not None and (owner is cls or is_trioq(owner)) and what not in found:
            found.append(what)
    return found


def render_class(page: Page, qualified: str, cls: type) -> None:
    page.add("```python", class_signature(cls), "```", "")
    bases = base_names(cls)
    if bases:
        page.add(f"Bases: {', '.join(bases)}.", "")
    doc = own_doc(cls)
    if doc is None:
        page.undocumented.append(qualified)
        page.add("*(no docstring)*", "")
    else:
        page.add(markdown(doc), "")
    supports = protocols(cls)
    if supports:
        page.add("Supports " + ", ".join(supports) + ".", "")
    if issubclass(cls, enum.Enum):
        page.add("Members:", "")
        for member in cls:
            page.add(f"- `{cls.__name__}.{member.name}` = `{member.value!r}`")
        page.add("")
    for name, value, owner in members(cls):
        where = f"{qualified}.{name}"
        inherited = f" (from `{owner.__name__}`)" if owner is not cls and is_public(owner) else ""
        if isinstance(value, property | functools.cached_property):
            getter = value.fget if isinstance(value, property) else value.func
            sig = safe_signature(getter)
            returns = annotation(sig.return_annotation) if sig is not None else ""
            kind = "property" if isinstance(value, property) else "cached property"
            writable = isinstance(value, property) and value.fset is not None
            page.add(f"#### `{cls.__name__}.{name}`", "")
            page.add("```python", f"{name}: {returns}" if returns else name, "```", "")
            page.add(f"A {'writable ' if writable else 'read-only '}{kind}{inherited}.", "")
        elif callable(value) or isinstance(value, staticmethod | classmethod):
            page.add(f"#### `{cls.__name__}.{name}()`", "")
            page.add("```python", function_block(name, value, method=True), "```", "")
            if inherited:
                page.add(f"Inherited{inherited}.", "")
        else:
            page.add(f"#### `{cls.__name__}.{name}`", "")
            page.add("```python", f"{name} = {default(value)}", "```", "")
            continue  # a class constant: documented by its class
        doc = own_doc(value)
        implemented = None if doc is not None else implements(page, cls, name)
        if implemented is not None:
            page.add(f"Implements [`{implemented}()`]({anchor(implemented)}).", "")
        elif doc is None:
            page.undocumented.append(where)
            page.add("*(no docstring)*", "")
        else:
            page.add(markdown(doc), "")


def implements(page: Page, cls: type, name: str) -> str | None:
    """``Store.add``-like: the documented method of a public protocol that ``cls`` implements, named ``name``."""
    for proto, qualified in page.protocols.items():
        if proto is cls or own_doc(proto.__dict__.get(name)) is None:
            continue
        wanted = [n for n, v in vars(proto).items() if not n.startswith("_") and callable(v)]
        if all(callable(getattr(cls, n, None)) for n in wanted):
            return f"{qualified}.{name}"
    return None


# -- the page --------------------------------------------------------------------------------------


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return "#" + text.replace(" ", "-")


def group(obj: Any) -> str:
    if isinstance(obj, type):
        return "Exceptions" if issubclass(obj, BaseException) else "Classes"
    if callable(obj):
        return "Functions"
    return "Types and constants"


GROUPS = ("Functions", "Classes", "Exceptions", "Types and constants")


def render() -> Page:
    """The whole page (``docs/reference.md``), and the public names found without a docstring."""
    page = Page()
    page.add(
        "# API reference",
        "",
        "Every public name of trioq: its signature and its docstring. Generated by",
        "`python docs/make_reference.py` from the docstrings of " + ", ".join(f"`{name}`" for name in MODULES) + ";",
        "`tests/test_reference.py` fails when this page is not what the script writes, so edit the",
        "docstrings and rerun the script instead of editing this page.",
        "",
    )
    modules = [importlib.import_module(name) for name in MODULES]
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and getattr(obj, "_is_protocol", False):
                page.protocols.setdefault(obj, f"{module.__name__}.{name}")
    for module in modules:
        names = ", ".join(f"[`{n}`]({anchor(f'{module.__name__}.{n}')})" for n in sorted(module.__all__, key=str.lower))
        page.add(f"- [`{module.__name__}`]({anchor(module.__name__)}): {names}")
    page.add("")
    for module in modules:
        render_module(page, module)
    while page.lines and not page.lines[-1]:
        page.lines.pop()
    page.lines = [_ADDRESS.sub("", line) for line in page.lines]
    return page


def render_module(page: Page, module: types.ModuleType) -> None:
    page.add(f"## `{module.__name__}`", "")
    doc = own_doc(module)
    if doc is None:
        page.undocumented.append(module.__name__)
    else:
        page.add(markdown(doc), "")
    by_group: dict[str, list[str]] = {g: [] for g in GROUPS}
    for name in module.__all__:
        by_group[group(getattr(module, name))].append(name)
    for title in GROUPS:
        names = sorted(by_group[title], key=str.lower)
        if not names:
            continue
        page.add(f"**{title}**", "")
        for name in names:
            render_name(page, module, name)


def render_name(page: Page, module: types.ModuleType, name: str) -> None:
    qualified = f"{module.__name__}.{name}"
    obj = getattr(module, name)
    page.add(f"### `{qualified}`", "")
    if id(obj) in page.seen:
        first = page.seen[id(obj)]
        page.add(f"The same object as [`{first}`]({anchor(first)}).", "")
        return
    page.seen[id(obj)] = qualified
    if isinstance(obj, type):
        render_class(page, qualified, obj)
        return
    if callable(obj):
        page.add("```python", function_block(name, obj, method=False), "```", "")
        doc = own_doc(obj)
    else:
        page.add("```python", f"{name} = {_ADDRESS.sub('', str(obj))}", "```", "")
        doc = comment_doc(module, name)
    if doc is None:
        page.undocumented.append(qualified)
        page.add("*(no docstring)*", "")
    else:
        page.add(markdown(doc), "")


def text() -> str:
    return "\n".join(render().lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/reference.md from trioq's docstrings.")
    parser.add_argument(
        "--check", action="store_true", help="exit 1, showing the difference, if docs/reference.md is stale"
    )
    args = parser.parse_args(argv)
    page = render()
    new = "\n".join(page.lines) + "\n"
    for name in page.undocumented:
        print(f"no docstring: {name}", file=sys.stderr)
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        if old == new:
            return 0
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), "docs/reference.md", "what the script writes", lineterm=""
        )
        print("\n".join(list(diff)[:80]), file=sys.stderr)
        print("docs/reference.md is stale: run python docs/make_reference.py", file=sys.stderr)
        return 1
    OUT.write_text(new)
    print(f"wrote docs/reference.md ({len(page.lines)} lines)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # document the tree this script lives in, not an installed trioq
    sys.exit(main())
