"""The generated TGIS stubs (`generation_pb2`, `generation_pb2_grpc`), wherever they come from.

A built install has them in `pagedcore.serving.grpc_gen` (CMake runs protoc at build time; they are
never committed). A source checkout that was never built has no such package: then protoc (from
grpcio-tools) generates them once into a per-user cache keyed by the .proto's hash, and that
folder is mounted as `pagedcore.serving.grpc_gen`, so the module names are the same either way.

The stubs load at first use of `generation_pb2` / `generation_pb2_grpc` (a module __getattr__), so
StubsUnavailableError can be imported, and caught, without loading them: it is the one optional
case (no built stubs, no grpcio-tools to make them); any other import error is a bug to surface.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

PACKAGE = "pagedcore.serving.grpc_gen"
_PACKAGE_PATH = Path(*PACKAGE.split("."))
_MODULES = ("generation_pb2", "generation_pb2_grpc")


class StubsUnavailableError(ImportError):
    """The stubs were never built and grpcio-tools is not installed to generate them: gRPC is off."""


def _import_built():
    return tuple(importlib.import_module(f"{PACKAGE}.{name}") for name in _MODULES)


def _source_proto() -> Path | None:
    """proto/generation.proto of the checkout this file sits in (python/pagedcore/serving/grpc/)."""
    candidate = Path(__file__).resolve().parents[4] / "proto" / "generation.proto"
    return candidate if candidate.is_file() else None


def _cache_root() -> Path:
    base = os.environ.get("PAGEDCORE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pagedcore")
    return Path(base) / "grpc_gen"


def generate_stubs(proto: Path, out_root: Path) -> Path:
    """Runs protoc on `proto` into out_root/<hash>/pagedcore/serving/grpc_gen/; returns that folder.
    The same staged path as the CMake build, so the generated imports match. Idempotent and safe
    against a concurrent first import (each writer renames a finished folder into place)."""
    try:
        import grpc_tools
    except ImportError:
        raise StubsUnavailableError(
            "the gRPC stubs were not built (no pagedcore.serving.grpc_gen) and grpcio-tools is not installed "
            "to generate them; rebuild with `scripts/dev-build` (or `pip install .`), or `pip install grpcio-tools`"
        ) from None
    text = proto.read_bytes()
    version = getattr(grpc_tools, "__version__", "") or _grpc_tools_version()
    key = hashlib.sha256(text + version.encode()).hexdigest()[:16]
    final = out_root / key
    package_dir = final / _PACKAGE_PATH
    if all((package_dir / f"{name}.py").is_file() for name in _MODULES):
        return package_dir
    out_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_root) as tmp:
        stage, out = Path(tmp) / "proto", Path(tmp) / "python"
        (stage / _PACKAGE_PATH).mkdir(parents=True)
        (stage / _PACKAGE_PATH / "generation.proto").write_bytes(text)
        (out / _PACKAGE_PATH).mkdir(parents=True)
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{stage}", f"--python_out={out}",
                   f"--pyi_out={out}", f"--grpc_python_out={out}", str(_PACKAGE_PATH / "generation.proto")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImportError(f"protoc failed on {proto}: {done.stderr.strip()}")
        try:
            os.replace(out, final)
        except OSError:
            if not package_dir.is_dir():   # not a concurrent writer that won the race
                raise
    return package_dir


def _grpc_tools_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpcio-tools")
    except PackageNotFoundError:
        return ""


def _mount(package_dir: Path) -> None:
    """Makes `pagedcore.serving.grpc_gen` resolve to package_dir."""
    existing = sys.modules.get(PACKAGE)
    if existing is not None and hasattr(existing, "__path__"):
        # An empty namespace package (a stray source folder): add our folder to its search path.
        existing.__path__.append(str(package_dir))
        return
    module = types.ModuleType(PACKAGE, "TGIS stubs generated at first import from proto/generation.proto")
    module.__path__ = [str(package_dir)]
    module.__package__ = PACKAGE
    sys.modules[PACKAGE] = module
    import pagedcore.serving

    pagedcore.serving.grpc_gen = module


def load():
    """(generation_pb2, generation_pb2_grpc): the built ones, else generated into the cache."""
    try:
        return _import_built()
    except ModuleNotFoundError as missing:
        if not (missing.name or "").startswith(PACKAGE):
            raise  # the stubs are there but something they import is not: not the optional case
        proto = _source_proto()
        if proto is None:
            raise ImportError(
                f"{PACKAGE} is missing from this install and no proto/generation.proto is near it; "
                "reinstall pagedcore (`pip install .` runs protoc at build time)") from missing
    _mount(generate_stubs(proto, _cache_root()))
    return _import_built()


def __getattr__(name: str):
    if name in _MODULES:
        modules = load()
        globals().update(zip(_MODULES, modules))  # later lookups find them without this hook
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["generation_pb2", "generation_pb2_grpc", "generate_stubs", "load", "PACKAGE", "StubsUnavailableError"]
