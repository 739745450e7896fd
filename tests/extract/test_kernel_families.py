"""The bitwise promises (tests marked `kernel_families`) hold under every lower CPU kernel family this
machine has, not only under the family it picks itself (tests/helpers/kernel_families.py)."""

import re

import pytest

from tests.helpers.kernel_families import FILES, KERNEL_FAMILIES, run_under


@pytest.mark.parametrize("family", KERNEL_FAMILIES, ids=[family.name for family in KERNEL_FAMILIES])
def test_bitwise_promises_hold_under_each_lower_kernel_family(family):
    reason = family.skip_reason()
    if reason:
        pytest.skip(reason)
    run = run_under(family, ["-q", "-p", "no:cacheprovider", "-m", "kernel_families", *FILES])
    assert (run.torch_capability, run.onednn_isa) == (family.torch_capability, family.onednn_isa), run.output[-3000:]
    assert run.returncode == 0, run.output[-3000:]
    summary = re.search(r"^(\d+) passed(.*) in ", run.output, re.MULTILINE)
    assert summary and int(summary.group(1)) > 0 and "skipped" not in summary.group(2), run.output[-3000:]
