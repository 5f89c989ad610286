"""The README is a front page and the documentation site is built from docs/: the generated pages match the code,
every code block runs in a test or says why not, and the site builds in strict mode."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- (not run in tests[^>]*|runs in (tests/\S+\.py)) -->")


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for topic in ("pip install -e .", "python -m pytest", "--env=libero_object", "sfengine.evaluate", "sfengine.plot"):
        assert topic in readme, topic
    for page in sorted((ROOT / "docs").glob("*.md")):  # every page is linked from the front page
        assert page.name == "index.md" or f"(docs/{page.name})" in readme, page.name


def test_the_generated_pages_match_the_code():
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def code_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, language, the line before) of every fenced code block of ``path``."""
    lines, blocks, fence = path.read_text().splitlines(), [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            if not fence:
                blocks.append((i + 1, line[3:].strip(), lines[i - 1] if i else ""))
            fence = not fence
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_code_block_runs_in_a_test_or_says_why_not(page):
    for line, language, before in code_blocks(page):
        if language == "text":  # a picture or a listing, not something to run
            continue
        marker = MARKER.fullmatch(before.strip())
        assert marker, (
            f"{page.name}:{line}: a {language} block with no <!-- runs in tests/... --> or <!-- not run ... -->"
        )
        if marker.group(2):  # the test it names exists and reads this page
            test = ROOT / marker.group(2)
            assert test.is_file() and page.name in test.read_text(), f"{page.name}:{line}: {marker.group(2)}"


def test_no_page_cites_a_design_document_the_repository_lacks():
    cited = "DESIGN" + " §"  # spelled apart, so that this file does not cite it
    for path in [
        *PAGES,
        ROOT / "benchmarks" / "README.md",
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("sfengine/**/*.py"),
    ]:
        assert cited not in path.read_text(), path


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_in_strict_mode_with_every_page(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), built
    configuration = (site / "configuration" / "index.html").read_text()
    assert "--residual_over" in configuration and "--learning_rate" in configuration
    shutil.rmtree(site)
