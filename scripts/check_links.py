#!/usr/bin/env python3
"""Every internal link of the README, the changelog and the user guide resolves.

A link `[text](path)` or `[text](path#anchor)` outside code must name a file that exists
(relative to the page) and, for a Markdown target, an anchor that one of its headings makes
(GitHub's and mdBook's rule: lower case, letters, digits, `-` and `_` kept, spaces to `-`,
other characters dropped; a repeated heading gets `-1`, `-2`, ...). Every page under docs/ must
also be listed in docs/SUMMARY.md, so the book has no orphan. Exit status 1 lists each broken
link as FILE:LINE: TARGET (what is wrong).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(text, keep_code=False):
    """(line number, line) for lines outside fenced code blocks, inline code removed unless
    `keep_code` (a heading's slug keeps the text of its inline code)."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield n, line if keep_code else re.sub(r"`[^`]*`", "", line)


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.replace("`", "")
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        for html in re.findall(r'<a\s+(?:name|id)="([^"]+)"', path.read_text(encoding="utf-8")):
            found.add(html)
        cache[path] = found
    return cache[path]


def check(page, problems):
    text = page.read_text(encoding="utf-8")
    for n, line in prose_lines(text):
        for target in LINK.findall(line) + IMAGE.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading makes #{anchor} in {dest.relative_to(ROOT)})")


def main():
    docs = ROOT / "docs"
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md"] + sorted(docs.rglob("*.md"))
    problems = []
    for page in pages:
        check(page, problems)
    summary = (docs / "SUMMARY.md").read_text(encoding="utf-8")
    listed = {(docs / t).resolve() for t in LINK.findall(summary)}
    for page in sorted(docs.rglob("*.md")):
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            problems.append(f"{page.relative_to(ROOT)}: not listed in docs/SUMMARY.md")
    for p in problems:
        print(p)
    print(f"check_links: {len(pages)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
