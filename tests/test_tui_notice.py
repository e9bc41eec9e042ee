"""The dashboard's header says what the operator says to everyone: a frozen manager (nothing new starts) and the
announcement (`bai cluster announce`, Backend.AI's `admin announcement update`), cut to fit, never pushing out the
stale marker."""

from __future__ import annotations

import pytest

from bai.tui.header import header_text

QUOTA = {
    "maxConcurrentSessions": 3,
    "concurrentSessions": 2,
    "totalResourceSlots": {"cpu": "8", "mem": str(16 * 2**30)},
    "occupiedSlots": {"cpu": "3", "mem": str(3 * 2**30)},
}


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_the_header_shows_a_freeze_and_the_announcement(width: int) -> None:
    quota = {**QUOTA, "frozen": True, "announcement": "maintenance at 21:00 UTC:\nsave your work"}
    text = header_text("AKIATESTADMIN0000000", quota, None, width).plain
    assert len(text) <= width and "\n" not in text
    assert text.startswith("AKIA…000  sessions 2/3")
    if width >= 80:
        assert text.endswith("❄ frozen")
        assert "📣 maintenance" in text
    if width >= 120:
        assert "📣 maintenance at 21:00 UTC: save your work" in text
    stale = header_text("AKIATESTADMIN0000000", quota, 7.0, width).plain
    assert len(stale) <= width
    if width >= 80:
        assert stale.endswith("⚠ stale 7s — reconnecting") and "frozen" not in stale  # (stale: figures are old)


def test_no_freeze_no_announcement_nothing_said() -> None:
    for quota in (QUOTA, {**QUOTA, "frozen": False, "announcement": None}, {**QUOTA, "announcement": "  "}):
        text = header_text("AKIATESTADMIN0000000", quota, None, 120).plain
        assert "frozen" not in text and "📣" not in text
