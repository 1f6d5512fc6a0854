"""The built-in templates come from the templates folder, so every test parametrized over
them covers a new one the day it lands (docs/design.md, 9. Tests)."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.hang import limit
from unroll.frontend.template import SUFFIX, builtin_template_dir, load_template
from unroll.testing import builtin_templates

ROOT = Path(__file__).resolve().parents[2]

#: run in a test copy of the package: collect the stepping and packing tests, and ask the
#: recompute properties' strategy for the new cell
DISCOVER = """
import sys
from pathlib import Path

import pytest
from hypothesis import find, strategies as st

copy, root = sys.argv[1:]


class Collected:
    def pytest_collection_finish(self, session):
        self.items = list(session.items)


collected = Collected()
status = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-o",
                      f"pythonpath={copy} {root}", "tests/train/test_stepper.py",
                      "tests/train/test_packing.py", "tests/engine/test_recompute.py"],
                     plugins=[collected])
import unroll

assert status == 0 and Path(unroll.__file__).is_relative_to(copy), (status, unroll.__file__)
for item in collected.items:
    print(item.nodeid)
recompute = next(item.module for item in collected.items if "test_recompute" in item.nodeid)
print("recompute draws", find(recompute.chains(st.just(2), 2)["cell"], lambda c: c == "elman"))
"""


def test_builtin_templates_are_the_templates_folder_by_kind():
    files = sorted(p.name[: -len(SUFFIX)] for p in builtin_template_dir().glob(f"*{SUFFIX}"))
    assert builtin_templates() == files
    kinds = {name: load_template(builtin_template_dir() / f"{name}{SUFFIX}").kind
             for name in files}
    for kind in set(kinds.values()):
        assert builtin_templates(kind) == [n for n in files if kinds[n] == kind]
    assert builtin_templates("no such kind") == []


def test_a_new_built_in_is_picked_up_by_the_stepping_packing_and_recompute_tests(tmp_path):
    shutil.copytree(ROOT / "unroll", tmp_path / "unroll",
                    ignore=shutil.ignore_patterns("__pycache__"))
    templates = tmp_path / "unroll" / "frontend" / "templates"
    (templates / f"elman{SUFFIX}").write_text((templates / f"rnn{SUFFIX}").read_text())
    done = subprocess.run([sys.executable, "-c", DISCOVER, str(tmp_path), str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=limit(200))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = done.stdout.splitlines()
    assert ("tests/train/test_stepper.py::"
            "test_stepping_from_given_states_equals_the_unrolled_net_at_every_cont[elman]") in ids
    for layers in (1, 2):
        assert (f"tests/train/test_stepper.py::"
                f"test_stepping_from_zeros_equals_the_unrolled_net_at_every_cont[elman-{layers}]"
                ) in ids
    for direction in ("forward", "reverse", "bidirectional"):
        assert (f"tests/train/test_packing.py::"
                f"test_packed_sequence_gets_its_result_alone[elman-{direction}]") in ids
    assert "recompute draws elman" in ids
