"""The docs stand alone: every path under relay/, tests/, bench/, config/ or docs/ that a Markdown file of the
repository names exists in it (a file, a folder, or a glob that matches something)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "bench").glob("*.md"))]

# A path begins a word (not the tail of a URL or of another path) and ends on a name character.
PATH = re.compile(r"(?<![\w./-])((?:relay|tests|bench|config|docs)/[\w./*-]*[\w/*])")

# What the benchmarks make when they run (and .gitignore leaves out): named by the docs, absent from a clone.
GENERATED = ("bench/results/", "bench/.venv-")


def _named_paths() -> list[tuple[str, int, str]]:
    """(doc, line number, path) for every path the docs name."""
    return [(doc.relative_to(ROOT).as_posix(), number, match.group(1))
            for doc in DOCS
            for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            for match in PATH.finditer(line)]


def _exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def test_every_path_a_doc_names_exists():
    named = _named_paths()
    assert len(named) > 100  # the docs do name paths: the pattern finds them
    missing = [f"{doc}:{number}: {path}" for doc, number, path in named
               if not path.startswith(GENERATED) and not _exists(path)]
    assert not missing, "\n".join(missing)


def test_what_the_docs_may_name_before_it_exists_is_what_git_ignores():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    for prefix in GENERATED:
        assert any(line.startswith(prefix) for line in ignored), prefix


def test_the_pattern_takes_paths_and_leaves_urls_and_tails():
    line = ("see relay/store/batch.py, `tests/store/` and bench/.venv-*/; not https://x.org/docs/plugins.md "
            "nor a/relay/x.py")
    assert PATH.findall(line) == ["relay/store/batch.py", "tests/store/", "bench/.venv-*/"]


def test_nothing_cites_a_design_page_outside_the_repository():
    outside = "DESIGN" + ".md"  # the team's page beside the repository; docs/architecture.md is the repository's
    files = [ROOT / "README.md", *(path for folder in ("relay", "tests", "bench", "config", "docs")
                                   for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".toml"))]
    citing = [path.relative_to(ROOT).as_posix() for path in files
              if not path.relative_to(ROOT).as_posix().startswith(GENERATED)
              and outside in path.read_text(encoding="utf-8")]
    assert len(files) > 100 and not citing, citing
