"""The GPU machine's environment for gpu_check.sh: the interpreter checked against the carried
wheels, the wheels unpacked into a folder put first on PYTHONPATH, and every module clef needs
imported once, its version reported.

    python benchmarks/gpu/gpu_env.py install WHEELS_DIR TARGET_DIR   # unpack the wheels that fit
    python benchmarks/gpu/gpu_env.py report OUT/environment.json     # import, versions, problems

A wheel is a zip archive laid out as site-packages; unpacking the ones whose tags fit this
interpreter is an install that needs neither pip nor a network, and touches nothing of the
machine's own packages (torch above all).
"""

from __future__ import annotations

import json
import platform
import sys
import zipfile
from pathlib import Path

SUPPORTED_PYTHONS = ((3, 11), (3, 12))
NEEDED = {
    "torch": "2.4",
    "transformers": "5.23",
    "tokenizers": "0.23.1",
    "safetensors": "0.8",
    "huggingface_hub": "1.31",
    "av": "12",
    "PIL": "10",
    "torchvision": "0.19",
    "pyarrow": "15",
    "numpy": "1.26",
    "typer": "0.12",
    "rich": "13",
}
"""What gpu_check.sh's steps import, and the lowest version each one needs (pyproject.toml)."""


def fits(wheel: str, version: tuple[int, int] | None = None) -> bool:
    """Whether a wheel's file name tags fit this interpreter: pure Python, the stable ABI of an
    older or equal CPython, or this exact CPython; x86_64 Linux or any platform."""
    major, minor = version or sys.version_info[:2]
    parts = wheel.removesuffix(".whl").split("-")
    python, abi, plat = parts[-3], parts[-2], parts[-1]
    if not (plat == "any" or ("linux" in plat and plat.endswith("x86_64"))):
        return False
    if abi == "none":
        return any(tag in ("py3", f"py{major}{minor}") or tag.startswith("py3") for tag in python.split("."))
    if abi == "abi3":
        return all(tag.startswith("cp3") and int(tag[3:]) <= minor for tag in python.split("."))
    return abi == f"cp{major}{minor}"


def python_problems() -> list[str]:
    problems = []
    if tuple(sys.version_info[:2]) not in SUPPORTED_PYTHONS:
        problems.append(
            f"Python {platform.python_version()} is not the assumed CPython 3.11 or 3.12: the carried regex "
            "wheels do not fit (av, tokenizers and safetensors use the stable ABI and still do)"
        )
    if platform.machine() != "x86_64" or sys.platform != "linux":
        problems.append(f"{sys.platform}/{platform.machine()} is not the assumed x86_64 Linux: no carried wheel fits")
    libc, glibc = platform.libc_ver()
    if libc == "glibc" and tuple(int(x) for x in glibc.split(".")[:2]) < (2, 28):
        problems.append(f"glibc {glibc} is older than 2.28: the av wheel (manylinux_2_28) will not load")
    return problems


def install(wheels: Path, target: Path) -> dict:
    """Unpack every wheel that fits into `target`; name the ones that do not."""
    target.mkdir(parents=True, exist_ok=True)
    unpacked, skipped = [], []
    for wheel in sorted(wheels.glob("*.whl")):
        if fits(wheel.name):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
            unpacked.append(wheel.name)
        else:
            skipped.append(wheel.name)
    return {"unpacked": unpacked, "skipped_not_this_python": skipped}


def _older(found: str, needed: str) -> bool:
    def numbers(text: str) -> tuple[int, ...]:
        head = text.split("+")[0]
        return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in head.split(".")[:3])

    return numbers(found) < numbers(needed)


def report() -> dict:
    """Import each needed module; its version and where it came from, or why it cannot be used."""
    import importlib

    modules, problems = {}, python_problems()
    for name, lowest in NEEDED.items():
        try:
            module = importlib.import_module(name)
        except Exception as error:  # a missing module or one that fails to load: both are reported
            modules[name] = {"error": f"{type(error).__name__}: {error}"}
            problems.append(f"{name} cannot be imported ({type(error).__name__}: {str(error)[:200]})")
            continue
        version = str(getattr(module, "__version__", "?"))
        modules[name] = {"version": version, "path": str(Path(module.__file__ or "?").parent)}
        if version != "?" and _older(version, lowest):
            problems.append(f"{name} {version} is older than the {lowest} clef needs")
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "glibc": platform.libc_ver()[1],
        "cuda_available": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch_cuda": torch.version.cuda,
        "modules": modules,
        "problems": problems,
    }


def main() -> None:
    command = sys.argv[1]
    if command == "install":
        result = install(Path(sys.argv[2]), Path(sys.argv[3]))
        print(json.dumps(result))
        for problem in python_problems():
            print(f"WARNING: {problem}", file=sys.stderr)
    elif command == "report":
        result = report()
        Path(sys.argv[2]).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        for problem in result["problems"]:
            print(f"PROBLEM: {problem}", file=sys.stderr)
    else:
        raise SystemExit(f"unknown command {command!r} (install or report)")


if __name__ == "__main__":
    main()
