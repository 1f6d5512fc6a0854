"""The documentation site: its generated pages equal the code, it builds strictly, and every
code block in it runs.

docs/design.md, 9. Tests. A page's ``python`` blocks run in order in one namespace (a
tutorial builds on its earlier blocks), its ``pycon`` blocks as doctests in that namespace,
its ``bash`` blocks under ``bash -e``, all in one scratch folder per page. A block that
must not run (a full training run, a command that needs MPI or Caffe) says why in an HTML
comment on the line before it, ``<!-- not run: REASON -->``; one that needs the UD English
EWT data says ``<!-- needs the EWT data -->`` and skips where it is absent, as the data
tests do. Blocks in a display language (``text``, ``jinja``, ``prototxt``, or none: output
and diagrams) are not code.
"""

from __future__ import annotations

import doctest
import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs import generate
from tests.hang import limit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN = {"python", "pycon", "bash"}
DISPLAY = {"", "text", "jinja", "prototxt"}
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
NEEDS_DATA = "<!-- needs the EWT data -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    marker: str

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text, found = page.read_text(), []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = before if before.startswith("<!--") else ""
        found.append(Block(str(page.relative_to(DOCS)), line, match.group(1), match.group(2),
                           marker))
    return found


PAGES = sorted(DOCS.rglob("*.md"))


def test_the_generated_pages_are_what_the_code_makes_now():
    made = generate.pages()
    stale = [path for path, text in made.items() if (DOCS / path).read_text() != text]
    assert not stale, f"{stale} differ from the code; run `python -m docs.generate`"


def test_every_code_block_is_run_or_says_why_not():
    for page in PAGES:
        for block in blocks(page):
            assert block.language in RUN | DISPLAY, (
                f"{block.where()}: a ```{block.language} block: give it a language in "
                f"{sorted(RUN)} to run, or {sorted(DISPLAY - {''})} for output")
            if block.marker:
                assert NOT_RUN.fullmatch(block.marker) or block.marker == NEEDS_DATA, (
                    f"{block.where()}: {block.marker!r}: expected '<!-- not run: REASON -->' "
                    f"or {NEEDS_DATA!r}")


def test_the_runner_reads_its_markers(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    page = tmp_path / "p.md"
    page.write_text("<!-- not run: it trains for an hour -->\n```bash\nfalse\n```\n\n"
                    "```python\nx = 1\n```\n")
    skipped, run = blocks(page)
    assert (skipped.marker, skipped.line, run.marker, run.code) == (
        "<!-- not run: it trains for an hour -->", 2, "", "x = 1\n")


def test_the_readmes_code_is_run_by_the_site():
    """The README is the front page: each of its code blocks is one of a page's, which runs
    (or says why not) there; its output blocks are not code."""
    readme = ROOT / "README.md"
    in_pages = {(b.language, b.code) for page in PAGES for b in blocks(page)}
    for match in FENCE.finditer(readme.read_text()):
        if match.group(1) not in RUN:
            continue
        assert (match.group(1), match.group(2)) in in_pages, (
            f"README.md's ```{match.group(1)} block starting {match.group(2)[:60]!r} is on no "
            f"page of docs/: put it on one, where it runs")


def _environment(scratch: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["UNROLL_DATA_HOME"] = str(scratch / "cache")
    env["UNROLL_EWT_URL"] = "http://127.0.0.1:9/"  # a fetch the docs start by mistake fails
    env["MPLBACKEND"] = "Agg"
    return env


def _has_ewt_data() -> bool:
    from unroll.tools.ewt import data_dir

    return any(data_dir().glob("*train*.conllu"))


def _forget_modules_made_under(root: Path) -> None:
    """Drop modules that tests wrote under ``root`` from the import cache: a page's
    ``mycells.py`` must be the one its own blocks wrote, not another test's of that name."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            del sys.modules[name]


@pytest.mark.parametrize("page", [p for p in PAGES if any(
    b.language in RUN for b in blocks(p))], ids=lambda p: str(p.relative_to(DOCS)))
def test_every_code_block_runs(page, tmp_path, monkeypatch):
    env = _environment(tmp_path)
    _forget_modules_made_under(tmp_path.resolve().parent)  # pytest's base temp folder
    importlib.invalidate_caches()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__"}
    skipped = []
    for block in blocks(page):
        if block.language not in RUN or NOT_RUN.fullmatch(block.marker):
            continue
        if block.marker == NEEDS_DATA and not _has_ewt_data():
            skipped.append(block.where())
            continue
        if block.language == "python":
            exec(compile(block.code, block.where(), "exec"), namespace)
        elif block.language == "pycon":
            test = doctest.DocTestParser().get_doctest(block.code, namespace, block.where(),
                                                       block.where(), 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS
                                           | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=lambda text: print(text, end=""))
            assert not runner.failures, f"{block.where()}: a doctest example failed (above)"
        else:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code],
                                  cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=limit(300))
            assert done.returncode == 0, (
                f"{block.where()}: exit status {done.returncode}\n{done.stdout}\n{done.stderr}")
    if skipped:
        pytest.skip(f"no UD English EWT data here: {', '.join(skipped)} not run")


def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip('the docs extra is not installed (pip install -e ".[docs]")')
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=limit(300),
                          env=_environment(tmp_path) | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    built = {p.relative_to(tmp_path / "site") for p in (tmp_path / "site").rglob("index.html")}
    assert len(built) >= len(PAGES), sorted(built)
