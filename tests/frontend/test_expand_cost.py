"""What an expansion costs, counted (docs/design.md, 3. Unrolling): a render per step, a parse
and a check per step shape, one net built to check it, whatever T is. Never timed here: the
seconds are bench/bench_expand.py's."""

from collections import OrderedDict

import pytest

import unroll.frontend.checked_nets
import unroll.frontend.recurrence
import unroll.frontend.render
import unroll.frontend.template
import unroll.frontend.unroller
from unroll.frontend.unroller import expand


@pytest.fixture
def counted(monkeypatch):
    """Counts of step renders, parses of step text, step checks and nets built, as
    expansions run (the sequence macro's chunks, a render and parse per 32 steps, aside)."""
    counts = dict.fromkeys(["renders", "parses", "checks", "nets"], 0)
    # an expansion another test made is served from expand's cache, with nothing to count
    monkeypatch.setattr(unroll.frontend.unroller, "_EXPANDED", OrderedDict())

    def counting(module, name, what, only=None):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            if only is None or only(*args):
                counts[what] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(unroll.frontend.render, "macro_text", "renders",
             only=lambda template, module, macro, s: macro == "step")
    counting(unroll.frontend.render, "parse_text", "parses",
             only=lambda text, message, origin: "(step, " in origin)
    counting(unroll.frontend.recurrence, "check_step", "checks")
    counting(unroll.frontend.checked_nets, "Net", "nets")
    return counts


@pytest.mark.parametrize("template, options", [
    ("lstm", dict()),
    ("gru", dict(direction="bidirectional", layers=2)),
    ("rnn", dict(initial_state="learned")),
])
def test_parses_and_checks_are_per_step_shape_renders_per_step(counted, template, options):
    seen = []
    for steps in (40, 80):
        expand(template, steps=steps, batch=2, input_dim=3, hidden=4, **options)
        seen.append(dict(counted))
        counted.update(dict.fromkeys(counted, 0))
    recurrences = 4 if options.get("layers") else 1
    assert [s["renders"] for s in seen] == [40 * recurrences, 80 * recurrences]
    # each recurrence's steps have one shape: one parse, one check
    assert [(s["parses"], s["checks"]) for s in seen] == [(recurrences, recurrences)] * 2
    assert [s["nets"] for s in seen] == [1, 1]


def test_a_step_whose_text_names_its_index_is_parsed_and_checked_each_time(counted, tmp_path):
    path = tmp_path / "rnn_each.prototxt.j2"
    source = (unroll.frontend.template.builtin_template_dir() / "rnn.prototxt.j2").read_text()
    head, tail = source.rsplit("{% endmacro %}", 1)  # the step macro is the last one
    path.write_text(head + 'layer { name: "{{ s.layer(\'mark\') }}_{{ s.t }}" type: "Silence" '
                           'bottom: "{{ s.input.x }}" }\n{% endmacro %}' + tail)
    expand(str(path), steps=6, batch=2, input_dim=3, hidden=4)
    assert counted["renders"] == counted["parses"] == counted["checks"] == 6
