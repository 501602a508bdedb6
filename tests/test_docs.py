"""The guide stays true: README.md at most 200 lines whose tour is docs/tour.md's, a CLI reference that is the
commands' own help, and every page of docs/ in the site's navigation (issue 49, item 1). The examples run in
tests/test_examples.py; `mkdocs build --strict` runs in CI (.ci/run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
README = CHECKOUT / "README.md"
TOUR = CHECKOUT / "docs" / "tour.md"


def readme_tour(tour: str) -> str:
    """docs/tour.md as README.md's "A ten-minute tour" section: headings a level down, links into docs/."""
    body = tour.split("\n", 1)[1]
    body = re.sub(r"^## ", "### ", body, flags=re.M)
    return re.sub(r"\]\(([a-z-]+\.md)\)", r"](docs/\1)", body).strip()


def test_the_readme_is_short_and_its_tour_is_the_guides():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    section = text.split("## A ten-minute tour\n", 1)[1].split("\n## ", 1)[0].strip()
    assert section == readme_tour(TOUR.read_text()), "README.md's tour differs from docs/tour.md: copy it over"


def test_the_cli_reference_is_the_commands_own_help():
    done = subprocess.run(
        [sys.executable, str(CHECKOUT / "scripts" / "cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_page_is_in_the_sites_navigation():
    navigation = (CHECKOUT / "mkdocs.yml").read_text()
    pages = {path.name for path in (CHECKOUT / "docs").glob("*.md")}
    assert pages, "docs/ has no pages"
    missing = sorted(page for page in pages if f": {page}" not in navigation)
    assert not missing, f"not in mkdocs.yml's nav: {missing}"
