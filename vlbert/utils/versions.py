"""The versions of the software that wrote a file: a model folder's config.json, a store's meta.json, a
run's run.json, and `vlbert --version`. They are records for whoever reads the file later (which torch
computed these features?), never compared to refuse a file that another environment wrote."""

from __future__ import annotations

import functools
import platform
from importlib import metadata
from typing import Any, Iterable

PROJECT = "vlbert-pipeline"  # the distribution's name (pyproject.toml)
PACKAGES = ("torch", "torchvision", "transformers", "tokenizers")
VERSIONS = "versions"  # the key in config.json, meta.json and run.json


def package_version(name: str) -> str | None:
    """The installed distribution's version, None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment_versions() -> dict[str, str | None]:
    """This process's versions: the project, Python, torch, torchvision, transformers and tokenizers as
    installed, and the CUDA and cuDNN that torch was built with (None in a CPU-only build)."""
    return dict(_environment())


@functools.cache
def _environment() -> dict[str, str | None]:
    import torch  # here, so that naming the key imports nothing heavy

    versions = {PROJECT: package_version(PROJECT), "python": platform.python_version()}
    versions.update({name: package_version(name) for name in PACKAGES})
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = _cudnn_version(torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    return versions


def _cudnn_version(number: int | None) -> str | None:
    """cuDNN's version number as text: MAJOR*10000 + MINOR*100 + PATCH from cuDNN 9 on, MAJOR*1000 + ... before."""
    if number is None:
        return None
    major, rest = divmod(number, 10000 if number >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def with_environment(recorded: list[dict[str, Any]] | None, current: dict[str, Any]) -> list[dict[str, Any]]:
    """The record of the environments that wrote a result, in order of first use, with `current` added
    where it is new (a result from before the record starts one)."""
    recorded = list(recorded or [])
    return recorded if current in recorded else [*recorded, current]


def version_lines(versions: dict[str, str | None] | None = None) -> Iterable[str]:
    """`vlbert --version`: one line per package, CUDA and cuDNN as torch was built."""
    versions = environment_versions() if versions is None else versions
    yield f"{PROJECT} {versions[PROJECT] or 'unknown (not installed)'}"
    for name in ("python", *PACKAGES):
        yield f"{name} {versions[name] or 'not installed'}"
    yield f"CUDA {versions['cuda'] or 'none (a CPU-only torch)'}"
    yield f"cuDNN {versions['cudnn'] or 'none'}"
