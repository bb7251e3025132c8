"""Import a released SGLang's own modules on a machine without a GPU.

`python -m infer_forge.harness.engines.sglang_import ROOT SCRIPT [ARG ...]` runs SCRIPT (a
Python file, as `__main__`) with ROOT's `sglang/` (an unpacked wheel, see sglang_release.py)
importable the way its parser, metrics collectors, log strings and bench client need:

- `sglang/__init__.py` and `sglang/srt/__init__.py` are skipped (they pull in the runtime);
  both become bare packages over ROOT.
- A third-party package that is not installed (triton, sgl_kernel, flashinfer, …) becomes a
  permissive stub module, but only when SGLang's own code imports it: an optional import of
  an installed library (sympy's flint, pydantic's email-validator) still fails as it would.
  torch, transformers, prometheus_client, … are the real installed ones.
- An SGLang submodule that raises while importing (it built a pydantic model over a stub, or
  imported a processor class this transformers lacks) is replaced by a stub module, and named
  in `soft_failed()`; the modules in HARD (the argument parser) must import for real.

This runs in its own process (never in the harness's): the stubs and the skipped package
initialisers would poison anything else imported beside them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import types
from typing import Any

# Modules whose failure to import is an error, not a stub: what the kit reads for real.
HARD = {"sglang.srt.server_args"}


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any

    def __getitem__(cls, key: Any) -> Any:
        return _Any

    def __or__(cls, other: Any) -> Any:
        return _Any

    def __ror__(cls, other: Any) -> Any:
        return _Any

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False


class _Any(metaclass=_Meta):
    """A name from a stubbed module: a class (so it can be subclassed and passed to
    issubclass), whose instances answer any attribute, call or index; called with one
    callable it returns it (a decorator)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Any()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __getitem__(self, key: Any) -> Any:
        return _Any

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    def __len__(self) -> int:
        return 0

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class StubModule(types.ModuleType):
    """A module any name can be imported from (each is `_Any`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any


def is_stub(value: Any) -> bool:
    """Whether `value` came from a stub (a dump should say "unknown", not print it)."""
    return value is _Any or isinstance(value, (_Any, StubModule))


_SOFT_FAILED: list[str] = []


def soft_failed() -> list[str]:
    """`module: error` for each SGLang module that was replaced by a stub."""
    return list(_SOFT_FAILED)


class _SoftLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            self.inner.exec_module(module)
        except Exception as e:
            if module.__name__ in HARD:
                raise
            _SOFT_FAILED.append(f"{module.__name__}: {type(e).__name__}: {e}"[:240])
            module.__class__ = StubModule


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.prefix = os.path.join(os.path.abspath(root), "sglang") + os.sep

    def find_spec(self, name: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        top = name.split(".")[0]
        if top == "sglang":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _SoftLoader(spec.loader)
            return spec
        if "." in name:  # a submodule: stubbed only below a stubbed package
            if not isinstance(sys.modules.get(top), StubModule):
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if top.startswith("_") or top in sys.stdlib_module_names:
            return None
        if importlib.machinery.PathFinder.find_spec(top) is not None:
            return None  # installed: the real one
        return (importlib.machinery.ModuleSpec(name, self, is_package=True)
                if self._from_sglang() else None)

    def _from_sglang(self) -> bool:
        """Whether the import statement being run is in SGLang's own code."""
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None:
            fn = frame.f_code.co_filename
            if not (fn.startswith("<frozen") or "importlib" in fn or fn == __file__):
                return fn.startswith(self.prefix)
            frame = frame.f_back
        return False

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(root: str | os.PathLike[str]) -> None:
    """Make ROOT's `sglang` importable in this process (see the module docstring)."""
    root = os.fspath(root)
    pkg = os.path.join(os.path.abspath(root), "sglang")
    if not os.path.isdir(pkg):
        raise SystemExit(f"sglang_import: no sglang/ under {root}")
    sys.meta_path.insert(0, _Finder(root))
    for name, path in (("sglang", pkg), ("sglang.srt", os.path.join(pkg, "srt"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m infer_forge.harness.engines.sglang_import ROOT "
                         "SCRIPT [ARG ...]")
    install(argv[0])
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
