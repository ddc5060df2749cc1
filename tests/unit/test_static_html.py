"""The report's HTML read where no script runs (an untrusted notebook, an export): all of it is there
as markup, and nothing in it needs a script to work."""

from __future__ import annotations

import re

from perfmagic.render.html import cards_html

FIX = "loader = DataLoader(ds, num_workers=4)  # was 0"


def test_a_fix_is_text_to_select_and_its_copy_button_is_made_only_by_a_script() -> None:
    card = {"id": "dataloader_workers", "severity": "high", "title": "t", "evidence": "e", "fix": FIX}
    page = cards_html([card])
    assert "<pre><code>loader = DataLoader(ds, num_workers=4)  # was 0</code></pre>" in page
    markup = re.sub(r"<script>.*?</script>", "", page, flags=re.S)  # what a page without scripts has
    assert "<button" not in markup and "onclick" not in markup and "Copy" not in markup
    # where scripts run, the script gives this report's fixes their button (tests/e2e clicks it)
    (script,) = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    (cards_id,) = re.findall(r'class="pm-cards" id="(pm-[0-9a-f]{32})"', page)
    assert f"getElementById('{cards_id}')" in script and "'pm-copy'" in script


def test_cards_without_a_fix_carry_no_script() -> None:
    page = cards_html([{"id": "x", "severity": "info", "title": "t", "evidence": "e", "fix": ""}])
    assert "<script" not in page and "pm-fix" not in page
