"""Docs that stay true: every relative link in the README and docs/ resolves, docs/architecture.md
names only modules that exist (and every package folder), and the README's first command leaves the
checkout clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    return [a or b for a, b in LINK.findall(text)]


def _broken(path: Path) -> list[str]:
    bad = []
    for target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same page
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            bad.append(f"{path.relative_to(ROOT)}: {target}")
    return bad


def test_every_relative_link_in_readme_and_docs_resolves():
    assert all(p.is_file() for p in DOCS)
    bad = [b for p in DOCS for b in _broken(p)]
    assert not bad, bad


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md) [anchor](#x) [web](https://example.org) ![img](missing.png)\n"
                    "[gone](nowhere.md#part)\n```\n[in code](ignored.md)\n```\n")
    assert [b.split(": ", 1)[1] for b in _broken_rel(page, tmp_path)] == ["missing.png", "nowhere.md#part"]


def _broken_rel(path: Path, root: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return _broken(path)
    finally:
        ROOT = saved


MODULE = re.compile(r"`(ctrlmem(?:\.[a-z_][a-z0-9_]*)+)`")
PATH = re.compile(r"`(ctrlmem/[a-z0-9_/]+(?:\.py)?)`")
#: a path inside the package written without its ``ctrlmem/`` (``search/families/grid.py``)
SUBPATH = re.compile(r"`((?:util|model|search|schedules|solver|plots|runtime|planner|experiments|explorer|reproduce|cli)"
                     r"/[a-z0-9_/]+\.py)`")


def _exists(dotted: str) -> bool:
    """``ctrlmem.a.b`` is a module or package, or an attribute defined in one (``ctrlmem.a.f``)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            if n == len(parts):
                return True
            mod = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            return re.search(rf"^\s*(def|class)\s+{parts[n]}\b|^{parts[n]}\s*[:=]|import .*\b{parts[n]}\b",
                             mod.read_text(encoding="utf-8"), flags=re.M) is not None
    return False


def test_architecture_names_only_modules_that_exist_and_every_package():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [m for m in set(MODULE.findall(text)) if not _exists(m)]
    missing += [p for p in set(PATH.findall(text)) if not (ROOT / p).exists()]
    assert not missing, sorted(missing)
    packages = sorted(d.name for d in (ROOT / "ctrlmem").iterdir() if (d / "__init__.py").is_file())
    unmentioned = [p for p in packages if f"{p}/" not in text]
    assert not unmentioned, f"docs/architecture.md does not describe {unmentioned}"


def test_module_paths_in_docs_exist():
    missing = sorted({f"{p.name}: {m}" for p in DOCS for m in SUBPATH.findall(p.read_text(encoding="utf-8"))
                      if not (ROOT / "ctrlmem" / m).is_file()}
                     | {f"{p.name}: {m}" for p in DOCS for m in PATH.findall(p.read_text(encoding="utf-8"))
                        if not (ROOT / m).exists()})
    assert not missing, missing


def test_every_module_appears_in_the_architecture_tree():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [p for p in (ROOT / "ctrlmem").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    unmentioned = sorted(str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{p.stem}\b", text))
    assert not unmentioned, f"docs/architecture.md does not mention {unmentioned}"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_reproduce_quick_leaves_a_fresh_clone_clean(tmp_path):
    """The README's first command writes its quick-size results beside the committed full-size
    ones, never over them: after it, `git status` of the clone shows no tracked file changed.
    (Two artifacts that draw figure files stand for all: the output folder is decided once.)"""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    # the code under test (this tree's, not the clone's committed one) in the clone as working directory
    run = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from ctrlmem.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", run, "reproduce", "--quick", "--only", "table1", "--only",
                           "closed-forms"], cwd=clone, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "build/reproduce-quick" in proc.stdout
    assert (clone / "build" / "reproduce-quick" / "table1.md").is_file()
    assert _git(clone, "status", "--porcelain") == ""
