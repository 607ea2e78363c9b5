"""Packages a process of the sink never imports: refused as if they were not installed.

pandas is the one today. Nothing the sink's driver or its Spark workers do needs it, but PyIceberg's
Arrow IO imports ``pyarrow.dataset``, whose module set-up makes a scalar and so asks pyarrow's pandas
shim whether pandas is there, importing all of it: 325 modules, 35 MB of RSS and 0.26 CPU s in each
Python process (docs/benchmarks/memory.md). Setting ``sys.modules["pandas"] = None`` breaks the shim
(Cython's import returns the ``None``); a finder that raises ``ModuleNotFoundError``, what a missing
package raises, makes pyarrow record that pandas is absent, as where it is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

NEVER_IMPORTED = ("pandas",)
"""Top-level packages the sink's run never imports (see the module's docstring)."""


class RefuseImports(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, that fails the import of ``packages`` and their modules as
    if they were not installed (``ModuleNotFoundError`` is what optional-import code catches);
    ``where`` names the process and the module that refuses them in the error."""

    def __init__(self, packages: Sequence[str], where: str) -> None:
        self.packages = tuple(packages)
        self.where = where

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.split(".", 1)[0] in self.packages:
            raise ModuleNotFoundError(
                f"{fullname} is not imported in {self.where} (it refuses {', '.join(self.packages)}: "
                "nothing the sink does needs it); report what asked for it",
                name=fullname,
            )
        return None


@contextlib.contextmanager
def refusing(where: str, packages: Sequence[str] = NEVER_IMPORTED) -> Iterator[bool]:
    """Refuse ``packages`` in this process while the block runs; yields whether it does (not when one
    of them is imported already: its memory is spent, and its submodules must stay importable)."""
    if any(name.split(".", 1)[0] in packages for name in sys.modules):
        yield False
        return
    finder = RefuseImports(packages, where)
    sys.meta_path.insert(0, finder)
    try:
        yield True
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
