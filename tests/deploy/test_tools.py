"""require_tool: a missing system tool fails the test under CI=true and skips it elsewhere."""

from __future__ import annotations

import pytest

from tests.support.tools import require_tool

MISSING = "chassis-no-such-tool"


def test_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CI=true, a missing tool fails the test, naming the tool and the apt package."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=rf"{MISSING}.*apt-get install some-package"):
        require_tool(MISSING, "some-package")


def test_missing_tool_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CI, a missing tool skips the test with the install hint."""
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install some-package"):
        require_tool(MISSING, "some-package")


def test_present_tool_is_found_on_the_system_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool in the system directories is found even when PATH lacks them."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert require_tool("sh", "dash") in {"/usr/bin/sh", "/bin/sh", "/usr/local/bin/sh"}
