"""target_session_attrs of a multi-host URL: which sessions a connection must leave."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.db.urls import session_left_behind, target_session_attrs

URL = "postgresql://u@h1:5432,h2:5432/db?target_session_attrs={}"


@pytest.mark.parametrize(
    ("attrs", "settings", "left"),
    [
        ("read-write", {"default_transaction_read_only": "on", "in_hot_standby": "off"}, True),
        ("read-write", {"default_transaction_read_only": "off", "in_hot_standby": "on"}, True),
        ("read-write", {"default_transaction_read_only": "off", "in_hot_standby": "off"}, False),
        ("read-write", {}, False),
        ("primary", {"default_transaction_read_only": "on", "in_hot_standby": "off"}, False),
        ("primary", {"in_hot_standby": "on"}, True),
        ("any", {"in_hot_standby": "on"}, False),
        ("", {"default_transaction_read_only": "on"}, False),
    ],
)
def test_a_session_is_left_only_when_it_lost_what_the_url_asked_for(
    attrs: str, settings: dict[str, str], left: bool
) -> None:
    """read-write leaves a read-only or standby session; primary only a standby; others stay."""
    url = URL.format(attrs) if attrs else "postgresql://u@h/db"
    assert target_session_attrs(url) == attrs
    assert session_left_behind(attrs, SimpleNamespace(**settings)) is left
