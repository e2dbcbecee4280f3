"""Every relative link in the Markdown pages (README, docs/, RESULTS, the recipes' READMEs) leads
somewhere: to a file of the repository and, with a #fragment, to a heading of that page, the way
GitHub names headings. A renamed section or a moved figure breaks the test, not the reader's click."""

import re
from pathlib import Path

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](image)
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = "```"
REPO = Path(__file__).resolve().parent.parent


def pages():
    """The repository's Markdown pages, not those of git or of a virtualenv inside it."""
    return sorted(
        page
        for page in REPO.rglob("*.md")
        if not any(part.startswith(".") or part == "site-packages" for part in page.relative_to(REPO).parts)
    )


def prose_lines(page):
    """(line number, line) of a page outside its fenced code blocks."""
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(FENCE):
            fenced = not fenced
        elif not fenced:
            yield number, line


def anchors(page):
    """GitHub's fragment for each heading: lowercased, punctuation dropped, spaces to hyphens, and
    -1, -2, ... after a repeated one."""
    found, seen = set(), {}
    for _, line in prose_lines(page):
        match = HEADING.match(line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_github_names_headings_as_the_links_expect(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "# Quality on Multi30k (CPU, `quality.py --preset cpu`)\n```\n# not a heading\n```\n## Notes\n### Notes\n"
    )
    assert anchors(page) == {"quality-on-multi30k-cpu-qualitypy---preset-cpu", "notes", "notes-1"}


def test_every_relative_link_in_the_docs_resolves():
    checked, broken = 0, []
    for page in pages():
        for number, line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                file, _, fragment = target.partition("#")
                dest = (page.parent / file) if file else page
                where = f"{page.relative_to(REPO)}:{number}: {target}"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    broken.append(f"{where}: no such heading in {dest.name}")
                checked += 1
    assert checked > 50 and not broken, "\n".join(broken)


def test_no_page_holds_a_merges_conflict_markers():
    # A merge resolved by hand once left its markers in studies/STUDY.md, and no link broke.
    marker = re.compile(r"^(<{7} |={7}$|>{7} )")
    found = [
        f"{page.relative_to(REPO)}:{number}"
        for page in pages()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if marker.match(line)
    ]
    assert not found, f"conflict markers left by a merge: {found}"
