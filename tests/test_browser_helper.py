"""The browser helper's failures name their cause: a Chromium that dies at start is reported with its
stderr, so a CI log says why the page test failed."""

import pytest

from tests.helpers.browser import visit


@pytest.mark.parametrize("wait", ["", "sleep 1\n"], ids=["at-once", "while-answering"])
def test_a_browser_that_exits_at_start_is_one_error_quoting_its_stderr(tmp_path, wait):
    fake = tmp_path / "chromium"
    fake.write_text(f"#!/bin/sh\necho 'cannot open display: none here' >&2\n{wait}exit 3\n")
    fake.chmod(0o755)
    page = tmp_path / "page.html"
    page.write_text("<p>hi</p>")
    with pytest.raises(RuntimeError) as failure:
        visit(page, str(fake))
    assert "cannot open display: none here" in str(failure.value)
    # However the race goes: dead before the first command, or gone while it waits for the answer.
    assert "exited with 3" in str(failure.value) or "closed its end of the pipe" in str(failure.value)
