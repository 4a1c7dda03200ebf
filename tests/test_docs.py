"""The README and docs/ stay true where a checker can tell: the README's inventory loads as
written, and every relative link in them names a file that exists (and a heading that does,
for a link with an anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.inventory import load

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_inventory_loads_as_written(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Inventory\n\n```toml\n(.*?)```", text, re.S)
    assert block is not None, "the README shows an inventory"
    path = tmp_path / "inventory.toml"
    path.write_text(block.group(1))
    inv = load(path)
    assert set(inv.hosts) == {"gpu-1", "gpu-2"}
    job = inv.jobs["nanogpt"]
    assert job.spec.command is not None and job.spec.command.checkpoint_file == "ckpt.pt"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, frag = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(target)
        elif frag and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            if frag not in {anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"
