"""The overview's chart, drawn on the server as SVG: jobs completed and failed per minute."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from .views import Minute

WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 12, 28
COMPLETED_COLOUR = "#6b8fb5"
FAILED_COLOUR = "#c0504d"


def throughput_svg(minutes: Sequence[Minute]) -> str:
    """An SVG bar chart, one stacked bar per minute (completed below, failed above), with the
    peak on the y axis and a time label every 15 minutes (UTC). Only numbers and times enter
    the markup, and they are escaped anyway."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((m.completed + m.failed for m in minutes), default=0)
    scale = plot_h / peak if peak else 0.0
    step = plot_w / max(1, len(minutes))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'role="img" aria-labelledby="chart-title" class="chart">',
        '<title id="chart-title">Jobs completed and failed per minute, last hour</title>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="#999" stroke-width="1"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end" class="axis">{peak}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" class="axis">0</text>',
    ]
    for index, minute in enumerate(minutes):
        x = LEFT + index * step
        done_h = minute.completed * scale
        failed_h = minute.failed * scale
        label = escape(
            f"{minute.start:%H:%M} UTC: {minute.completed} completed, {minute.failed} failed"
        )
        parts.append(f"<g><title>{label}</title>")
        if done_h:
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{TOP + plot_h - done_h:.1f}" width="{step - 2:.1f}" '
                f'height="{done_h:.1f}" fill="{COMPLETED_COLOUR}"/>'
            )
        if failed_h:
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{TOP + plot_h - done_h - failed_h:.1f}" '
                f'width="{step - 2:.1f}" height="{failed_h:.1f}" fill="{FAILED_COLOUR}"/>'
            )
        parts.append("</g>")
        if index % 15 == 0 or index == len(minutes) - 1:
            parts.append(
                f'<text x="{x + step / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle" '
                f'class="axis">{escape(f"{minute.start:%H:%M}")}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
