"""Reading a net's prototxt once per layer shape (unroll.core.net_text): the message protobuf's
parser makes, from one protobuf parse per shape, and protobuf's own reading of anything else."""

import pytest
from google.protobuf import text_encoding, text_format
from hypothesis import given
from hypothesis import strategies as st

import unroll.core.net_text
from unroll.core.proto import NetParameter, PrototxtError, parse_text, to_text
from unroll.frontend.unroller import expand


def _protobuf(text: str) -> NetParameter:
    net = NetParameter()
    text_format.Parse(text, net)
    return net


def _counting_parses(monkeypatch) -> list:
    parses = []
    parse = unroll.core.net_text.text_format.Parse
    monkeypatch.setattr(unroll.core.net_text.text_format, "Parse",
                        lambda text, message: parses.append(text) or parse(text, message))
    return parses


@pytest.mark.parametrize("template, options", [
    ("lstm", dict(input_dim=3, hidden=4)),
    ("gru", dict(input_dim=2, hidden=3, direction="bidirectional", layers=2)),
    ("rnn", dict(input_dim=2, hidden=3, initial_state="learned")),
])
def test_an_unrolled_net_reads_as_protobuf_reads_it(template, options):
    text = to_text(expand(template, steps=40, batch=2, **options))
    read = NetParameter()
    assert unroll.core.net_text.parse_net_text(text, read)  # read by shape, not left to protobuf
    assert read.SerializeToString() == _protobuf(text).SerializeToString()


def test_protobuf_parses_once_per_layer_shape_whatever_the_steps(monkeypatch):
    parses = _counting_parses(monkeypatch)
    counts = []
    for steps in (40, 80):
        text = to_text(expand("lstm", steps=steps, batch=2, input_dim=3, hidden=4, chunk=None))
        del parses[:]
        parse_text(text, NetParameter())
        counts.append(len(parses))
    # the rest of the net, the Input, the projection, the slices, a step's four layers,
    # the concat and the silence of the final states
    assert counts == [counts[0]] * 2 and counts[0] <= 12


_STRINGS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


@given(st.lists(_STRINGS, min_size=3, max_size=3), st.lists(_STRINGS, min_size=3, max_size=3))
def test_strings_with_escapes_quotes_and_unicode_read_as_protobuf_reads_them(one, two):
    def layer(names):
        quoted = [text_encoding.CEscape(n, as_utf8=False) for n in names]
        return (f'layer {{ name: "{quoted[0]}" type: "ReLU" # a "quote" in a comment\n'
                f'  bottom: \'{quoted[1]}\' top: "{quoted[2]}" }}\n')

    text = 'name: "n"\n' + layer(one) + layer(two)
    assert parse_text(text, NetParameter()).SerializeToString() == _protobuf(
        text).SerializeToString()


@pytest.mark.parametrize("text", [
    'layer: { name: "a" } layer { name: "b" }',  # other ways to write a layer
    'layer < name: "a" > layer{name:"b"}',
    '# a layer { name: "x" }\nname: "n" layer { name: "a" bottom: "#" }\n# layer\n',
    'layer { name: "a" top: "layer" } layer { name: "b" }',
])
def test_other_ways_to_write_the_layers_read_as_protobuf_reads_them(text):
    net = NetParameter()
    assert unroll.core.net_text.parse_net_text(text, net)
    assert net.SerializeToString() == _protobuf(text).SerializeToString()


@pytest.mark.parametrize("text", [
    'layer { name: "a" "b" }',  # adjacent strings make one value
    'layer { name: "a" } layer { name: "b" "c" }',
    'layer { name: "a" }}',
    'layer { name: "a" ',
    'name: "a"layer { name: "b" } "c"',  # text after the layers: it would join the name
    'layer { name: "a" } force_backward: true',
    'state < layer { name: "a" } >',
    'layer { name: "a" include { layer: 1 } }',  # a word layer inside a layer
])
def test_a_text_it_does_not_read_is_left_to_protobuf(text):
    net = NetParameter()
    assert not unroll.core.net_text.parse_net_text(text, net)
    assert net == NetParameter()


def test_comments_between_and_after_the_layers_are_read_past():
    text = ('name: "n" # the net\nlayer { name: "a" type: "ReLU" }\n# between\n'
            'layer { name: "b" type: "ReLU" } # after\n')
    net = NetParameter()
    assert unroll.core.net_text.parse_net_text(text, net)
    assert net.SerializeToString() == _protobuf(text).SerializeToString()


def test_a_mistake_is_protobufs_error_naming_its_line():
    text = 'name: "n"\nlayer { name: "a" type: "ReLU" }\nlayer { name: "b" tpye: "ReLU" }\n'
    with pytest.raises(PrototxtError, match=r'^net\.prototxt:3: cannot parse NetParameter: .*'
                                            r'"tpye"'):
        parse_text(text, NetParameter(), "net.prototxt")


_GAPS = st.sampled_from(["", " ", "\n", "# layer { name: \"x\n", "#'layer\n", "\n# }\n"])
_NAMES = st.one_of(_STRINGS, st.sampled_from(["layer", "layer {", "# layer", "'\"", "x}layer"]))


@given(st.lists(st.tuples(_GAPS, _GAPS, _NAMES, _NAMES), min_size=1, max_size=4), _GAPS)
def test_layers_between_comments_and_with_layer_in_their_strings_read_as_protobuf_reads_them(
        blocks, after):
    # docs/design.md, 3: the cut at each word layer outside strings and comments
    text = 'name: "n"' + "".join(
        f'{gap}layer{inner}{{ name: "{text_encoding.CEscape(name, as_utf8=False)}" '
        f"top: '{text_encoding.CEscape(top, as_utf8=False)}' }}"
        for gap, inner, name, top in blocks) + after
    read = NetParameter()
    assert unroll.core.net_text.parse_net_text(text, read)
    assert read.SerializeToString() == _protobuf(text).SerializeToString()
