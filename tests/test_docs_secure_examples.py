"""Every documented example that binds beyond loopback sets a client key."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
WIDE = re.compile(r"0\.0\.0\.0|\[::\]|--host\s+(?!127\.0\.0\.1|localhost|::1)\S")
KEYED = ("--api-key-file", "client_api_key_file", "BALANCEROUTE_API_KEY", "--api-key-env", "client_api_key_env")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_examples_that_listen_beyond_loopback_set_a_client_key() -> None:
    offending, wide = [], 0
    for page in _pages():
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            if WIDE.search(block):
                wide += 1
                if not any(k in block for k in KEYED):
                    offending.append(f"{page.relative_to(ROOT)}: {block.strip().splitlines()[0]}")
    assert not offending, offending
    assert wide >= 3  # the 4P1D example, the systemd unit and the Deployment
