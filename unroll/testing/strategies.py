"""Hypothesis strategies: shapes, arrays, fillers, cont patterns, random nets, step variables."""

from __future__ import annotations

import numpy as np

FLOAT = np.float64


def _hypothesis():
    """hypothesis's ``strategies`` and ``extra.numpy``, imported when a strategy is made."""
    try:
        from hypothesis import strategies
        from hypothesis.extra import numpy
    except ImportError:
        raise ImportError(
            "unroll.testing's strategies need hypothesis (pip install 'unroll[test]'); "
            "the gradient checkers do not"
        ) from None
    return strategies, numpy


def shapes(min_dims: int = 1, max_dims: int = 4, min_side: int = 1, max_side: int = 4):
    """Array shapes, small enough for finite differences."""
    _, hnp = _hypothesis()
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def arrays(shape, low: float = -2.0, high: float = 2.0, away_from=None, margin: float = 1e-2):
    """float64 arrays of ``shape`` (a tuple or a strategy of shapes) in [low, high].

    ``away_from`` lists kinks (e.g. ``[0.0]`` for ReLU): values closer than
    ``margin`` are pushed away, so finite differences never straddle a kink.
    """
    st, hnp = _hypothesis()
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)
    strategy = hnp.arrays(FLOAT, shape, elements=elements)
    if away_from:
        kinks = np.asarray(away_from, FLOAT)

        def push(a):
            for k in kinks:
                near = np.abs(a - k) < margin
                a = np.where(near, k + np.where(a >= k, margin, -margin) * 2, a)
            return a

        strategy = strategy.map(push)
    return strategy


def distinct_arrays(shape, low: float = -2.0, high: float = 2.0, gap: float = 1e-2):
    """float64 arrays whose entries differ pairwise by at least ``gap`` (for MAX-style ops)."""
    st, _ = _hypothesis()

    def build(args):
        shape, seed = args
        n = int(np.prod(shape))
        values = np.linspace(low, high, max(n, 2))[:n]
        values = np.random.default_rng(seed).permutation(values)
        if n > 1 and (high - low) / (n - 1) < gap:
            values = values * (gap * (n - 1) / (high - low))
        return values.reshape(shape)

    shape_st = shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))
    return st.tuples(shape_st, st.integers(0, 2**31 - 1)).map(build)


def fillers():
    """FillerParameter prototxt snippets with Caffe's filler types."""
    st, _ = _hypothesis()
    return st.sampled_from([
        'type: "constant" value: 0.1',
        'type: "uniform" min: -0.5 max: 0.5',
        'type: "gaussian" std: 0.3',
        'type: "xavier"',
        'type: "msra"',
    ])


def axes(ndim: int):
    """A valid axis for an ``ndim``-D blob, negative or not."""
    st, _ = _hypothesis()
    return st.integers(-ndim, ndim - 1)


# -- recurrent inputs --------------------------------------------------------


#: the kinds of cont pattern :func:`cont_pattern` makes
CONT_KINDS = ("ones", "zeros", "padded_left", "padded_right", "packed")


def cont_pattern(kind: str, steps: int, batch: int, seed: int = 0) -> np.ndarray:
    """A (T, N) cont mask of one kind, seeded: no hypothesis needed.

    ``"ones"``: one sequence running through every column from a carried state;
    ``"zeros"``: every step starts a sequence; ``"padded_left"``: padding
    first (``align="right"``); ``"padded_right"``: padding after each
    sequence; ``"packed"``: several whole sequences one after another in each
    column. As in Caffe, 0 marks a sequence's first step and every padded step.

    >>> cont_pattern("padded_left", 5, 2, seed=1).T.tolist()
    [[0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0, 1.0]]
    """
    if kind not in CONT_KINDS:
        raise ValueError(f"unknown cont pattern {kind!r}; expected one of {CONT_KINDS}")
    rng = np.random.default_rng(seed)
    cont = np.ones((steps, batch))
    if kind == "zeros":
        return cont * 0
    if kind == "ones":
        return cont
    for n in range(batch):
        if kind == "packed":
            starts = [0] + sorted(int(t) for t in rng.choice(np.arange(1, steps), size=min(
                steps - 1, int(rng.integers(1, 4))), replace=False)) if steps > 1 else [0]
            cont[starts, n] = 0
            continue
        length = int(rng.integers(1, steps + 1))
        first = steps - length if kind == "padded_left" else 0
        cont[:, n] = 0
        cont[first + 1:first + length, n] = 1
    return cont


def cont_patterns(steps, batch, kinds=CONT_KINDS):
    """(T, N) cont masks of the ``kinds`` of :func:`cont_pattern`; ``steps`` and ``batch``
    are integers or strategies of them."""
    st, _ = _hypothesis()
    as_st = [v if isinstance(v, st.SearchStrategy) else st.just(v) for v in (steps, batch)]
    return st.builds(cont_pattern, st.sampled_from(list(kinds)), *as_st,
                     st.integers(0, 2**31 - 1))


def step_variables(max_input: int = 4, max_hidden: int = 4, max_steps: int = 5,
                   max_batch: int = 3):
    """What a step template is unrolled with: dicts of ``steps``, ``batch``, ``input_dim``,
    ``hidden``, ``direction`` and ``layers`` (the keywords of :func:`check_template`)."""
    st, _ = _hypothesis()
    return st.fixed_dictionaries({
        "steps": st.integers(1, max_steps),
        "batch": st.integers(1, max_batch),
        "input_dim": st.integers(1, max_input),
        "hidden": st.integers(1, max_hidden),
        "direction": st.sampled_from(["forward", "reverse", "bidirectional"]),
        "layers": st.integers(1, 2),
    })


# -- random nets -------------------------------------------------------------


def _input_layer(**shapes) -> str:
    tops = " ".join(f'top: "{n}"' for n in shapes)
    dims = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes.values())
    return f'layer {{ name: "in" type: "Input" {tops} input_param {{ {dims} }} }}\n'


def _layer(name, type_, bottom, top, extra="") -> str:
    return f'layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {extra} }}\n'


def _ip(name, bottom, top, n, extra="") -> str:
    gauss = ('weight_filler { type: "gaussian" std: 0.5 } '
             'bias_filler { type: "gaussian" std: 0.5 }')
    return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" '
            f'{extra}\n  inner_product_param {{ num_output: {n} {gauss} }} }}\n')


def _loss(bottom, name="loss") -> str:
    return (f'layer {{ name: "{name}" type: "EuclideanLoss" bottom: "{bottom}" bottom: "t" '
            f'top: "{name}" }}\n')


def random_nets(batch: int = 4, dim: int = 3, max_layers: int = 9):
    """Net prototxts over inputs ``x`` and ``t`` (both (batch, dim)), with the names worth
    keeping: ``(text, keep)``. They fan out, chain in-place activations and Dropout, view
    (Reshape, Flatten), Slice and Concat, share params by name and end in one or two
    EuclideanLosses: the shapes of net that stress splits, in-place and the memory plan."""
    st, _ = _hypothesis()
    N, D = batch, dim

    @st.composite
    def nets(draw):
        text = "force_backward: true\n" + _input_layer(x=(N, D), t=(N, D))
        blobs, k = ["x"], 0
        for _ in range(draw(st.integers(1, max_layers))):
            k += 1
            src = draw(st.sampled_from(blobs))
            kind = draw(st.sampled_from(["ip", "shared_ip", "act", "act_in_place", "view",
                                         "slice_concat", "sum", "dropout"]))
            top = f"b{k}"
            if kind == "ip":
                text += _ip(f"l{k}", src, top, D)
            elif kind == "shared_ip":
                text += _ip(f"l{k}", src, top, D, 'param { name: "W" } param { name: "bias" }')
            elif kind in ("act", "act_in_place"):
                act = draw(st.sampled_from(["TanH", "Sigmoid", "ReLU"]))
                if kind == "act_in_place" and src != "x":
                    top = src
                text += _layer(f"l{k}", act, src, top)
            elif kind == "dropout":
                top = src if src != "x" else top  # in place, but never on the input itself
                text += _layer(f"l{k}", "Dropout", src, top, "dropout_param { dropout_ratio: 0.3 }")
            elif kind == "view":
                text += _layer(f"l{k}a", "Reshape", src, f"{top}_3d",
                               f"reshape_param {{ shape {{ dim: {N} dim: {D} dim: 1 }} }}")
                text += _layer(f"l{k}", "Flatten", f"{top}_3d", top)
            elif kind == "slice_concat":
                text += (f'layer {{ name: "l{k}a" type: "Slice" bottom: "{src}" top: "{top}_p0" '
                         f'top: "{top}_p1" slice_param {{ axis: 0 }} }}\n')
                text += _layer(f"l{k}b", "TanH", f"{top}_p1", f"{top}_q1")
                text += (f'layer {{ name: "l{k}" type: "Concat" bottom: "{top}_q1" '
                         f'bottom: "{top}_p0" top: "{top}" concat_param {{ axis: 0 }} }}\n')
            else:
                other = draw(st.sampled_from(blobs))
                text += (f'layer {{ name: "l{k}" type: "Eltwise" bottom: "{src}" '
                         f'bottom: "{other}" top: "{top}" }}\n')
            if top not in blobs:
                blobs.append(top)
        text += _loss(blobs[-1])
        if len(blobs) > 2 and draw(st.booleans()):
            text += _loss(draw(st.sampled_from(blobs[1:-1])), name="loss2").replace(
                'top: "loss2"', 'top: "loss2" loss_weight: 0.5')
        keep = draw(st.lists(st.sampled_from(blobs), max_size=2, unique=True))
        return text, keep

    return nets()
