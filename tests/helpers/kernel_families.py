"""Tests run again in a child process under a lower CPU kernel family.

x86 CPUs differ in the kernels torch (ATen), oneDNN and MKL pick, and kernels round differently, so a
bitwise promise can hold on one machine and fail on the next. Each library takes a variable that
caps its family (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS); a child with
all three set computes as a machine of that family would, so a machine with AVX-512 also checks
AVX2's kernels. The child reports the family torch and oneDNN took; MKL reports none, so its
variable is asked for, not checked.

    python -m tests.helpers.kernel_families PYTEST_ARGS...   # the child: report the family, run pytest
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# The test files that hold `kernel_families` cases: collecting the whole suite in every child would
# cost more than the cases.
FILES = ("tests/extract/test_detector_batching.py",)


@dataclass(frozen=True)
class KernelFamily:
    name: str
    requires: tuple[str, ...]  # torch.cpu.get_capabilities() flags a CPU needs to run the family
    # Flags of which any makes the family a lower one than the CPU's own for float32. The VNNI and BF16
    # extensions (integer and bfloat16 kernels) are not among them: with them (an AMD EPYC here), the
    # avx512 family gave the native float32 matmul and convolution bits.
    beyond: tuple[str, ...]
    torch_capability: str  # torch.backends.cpu.get_cpu_capability() under it
    onednn_max_isa: str
    onednn_isa: str  # how oneDNN's verbose output names that ISA
    mkl_instructions: str

    @property
    def environment(self) -> dict[str, str]:
        return {"ATEN_CPU_CAPABILITY": self.torch_capability.lower(), "ONEDNN_MAX_CPU_ISA": self.onednn_max_isa,
                "MKL_ENABLE_INSTRUCTIONS": self.mkl_instructions}

    def skip_reason(self) -> str | None:
        """Why this machine cannot check the family as a lower one; None when it can."""
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return f"{platform.machine()} is not an x86 CPU: the kernel families are x86's"
        flags = torch.cpu.get_capabilities()
        missing = [flag for flag in self.requires if not flags.get(flag)]
        if missing:
            return f"this CPU lacks {', '.join(missing)}: it cannot run the {self.name} family"
        if not any(flags.get(flag) for flag in self.beyond):
            return f"{self.name} is this CPU's own float32 family, which the tests in the suite's process run"
        return None


KERNEL_FAMILIES = (
    KernelFamily("avx512", ("avx512_f", "avx512_bw", "avx512_dq", "avx512_vl"),
                 ("amx_tile", "avx512_fp16"), "AVX512", "AVX512_CORE",
                 "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions", "AVX512"),
    KernelFamily("avx2", ("avx2", "fma3"), ("avx512_f",), "AVX2", "AVX2", "Intel AVX2", "AVX2"),
    KernelFamily("sse4", ("sse4_2",), ("avx",), "DEFAULT", "SSE41", "Intel SSE4.1", "SSE4_2"),
)


@dataclass
class FamilyRun:
    returncode: int
    output: str
    torch_capability: str | None  # as the child reported them
    onednn_isa: str | None


def run_under(family: KernelFamily, pytest_args: list[str], timeout: float = 600) -> FamilyRun:
    """pytest with `pytest_args` in a child process under `family`."""
    env = {**os.environ, **family.environment}
    child = subprocess.run([sys.executable, "-m", "tests.helpers.kernel_families", *pytest_args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=timeout)
    output = child.stdout + child.stderr
    capability = re.search(r"^torch capability: (\S+)$", output, re.MULTILINE)
    isa = re.search(r"^onednn_verbose,.*,isa:(.+)$", output, re.MULTILINE)
    return FamilyRun(child.returncode, output, capability and capability.group(1), isa and isa.group(1).strip())


class _OneThread:
    """Runs the child's tests single-threaded, after tests/conftest.py set the suite's count: as the
    extraction job's CPU lanes compute, and without OpenMP's spin-waits beside busy neighbours."""

    @staticmethod
    def pytest_configure(config) -> None:
        torch.set_num_threads(1)


def _report_family_and_run_pytest(pytest_args: list[str]) -> int:
    print(f"torch capability: {torch.backends.cpu.get_cpu_capability()}", flush=True)
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):  # oneDNN prints its ISA once
        torch.mkldnn_convolution(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 1, 1), None, (0, 0), (1, 1), (1, 1), 1)
    import pytest

    return pytest.main(pytest_args, plugins=[_OneThread()])


if __name__ == "__main__":
    sys.exit(_report_family_and_run_pytest(sys.argv[1:]))
