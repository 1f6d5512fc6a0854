"""The data walk of liveness over arrays (docs/design.md, 6. Memory): on random run orders and
recomputation plans it finds what a walk action by action, touch by touch, finds."""

from array import array
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from unroll.engine.memory.walk import data_walk, step_roots


def walked(tops, bottoms, reads, n_blobs, bounds, order, runs, again, layer_need, scratch):
    """The walk in time order, one touch at a time: a use moves a lifetime's end; a root run
    again gets a buffer at the first write of each action writing it."""
    S, own, lives = len(tops), {}, []  # lives: [root, first, last, action]
    current, born, again_at = [-1] * n_blobs, [-2] * n_blobs, {}

    def touch(roots, t):
        for r in roots:
            if current[r] >= 0:
                lives[current[r]][2] = t
            else:
                own.setdefault(r, [t, t])[1] = t

    def run(steps, action, t):
        for s in steps:
            for r in tops[s]:
                if again[r] and born[r] != action:
                    born[r], current[r] = action, len(lives)
                    lives.append([r, t, t, action])
            touch(tops[s] + bottoms[s], t)
            if action >= 0 and scratch[s]:
                again_at.setdefault(s, []).append(t)
            t += 1
        return t

    t, back = run(range(S), -1, 0) + 1, [0] * S
    for i, a in enumerate(order):
        if a >= 0:
            t = run(runs[i], i, t)
            continue
        for s in reversed(range(bounds[~a], bounds[~a + 1])):
            back[s] = t
            if layer_need[s]:
                touch(reads[s], t)
            t += 1
    lives.sort(key=lambda life: (life[0], life[1]))
    first, last = [-1] * (n_blobs + len(lives)), [-1] * (n_blobs + len(lives))
    for r, (f, la) in own.items():
        first[r], last[r] = f, la
    for j, (_, f, la, _) in enumerate(lives):
        first[n_blobs + j], last[n_blobs + j] = f, la
    return (first, last, [life[0] for life in lives], [life[3] for life in lives], back,
            [(s, tuple(v)) for s, v in again_at.items()])


@st.composite
def plans(draw):
    """A run order of steps reading and writing roots, its cuts, and backward's actions: every
    segment's backward once, last first, each after forward runs of some of its steps."""
    n_blobs = draw(st.integers(1, 8))
    S = draw(st.integers(1, 12))
    roots = st.lists(st.integers(0, n_blobs - 1), max_size=3).map(tuple)
    tops, bottoms, reads = (draw(st.lists(roots, min_size=S, max_size=S)) for _ in range(3))
    layer_need = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    reads = [r if need else () for r, need in zip(reads, layer_need)]
    cuts = sorted(draw(st.sets(st.integers(1, S - 1), max_size=3))) if S > 1 else []
    bounds = [0, *cuts, S]
    order, runs = [], []
    for k in reversed(range(len(bounds) - 1)):
        for _ in range(draw(st.integers(0, 2))):
            order.append(k)
            runs.append(array("i", sorted(draw(st.sets(st.sampled_from(
                range(bounds[k], bounds[k + 1])))))))
        order.append(~k)
        runs.append(None)
    again = bytes(draw(st.lists(st.booleans(), min_size=n_blobs, max_size=n_blobs)))
    scratch = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    return tops, bottoms, reads, n_blobs, bounds, order, runs, again, layer_need, scratch


@settings(max_examples=300, deadline=None)
@given(plans())
def test_the_walk_over_arrays_finds_what_a_walk_touch_by_touch_finds(plan):
    tops, bottoms, reads, n_blobs, bounds, order, runs, again, layer_need, scratch = plan
    steps = [SimpleNamespace(tops=t, bottoms=b) for t, b in zip(tops, bottoms)]
    layers = [SimpleNamespace(scratch_specs={"s": ((1,), "f4", "both")} if keeps else {},
                              memory=SimpleNamespace(shares_bottom=())) for keeps in scratch]
    at = step_roots(steps, layers, range(n_blobs), reads, layer_need)
    got = data_walk(at, n_blobs, bounds, order, runs, again, layer_need)
    want = walked(*plan)
    assert got.first.tolist() == want[0] and got.last.tolist() == want[1]
    assert got.life_root.tolist() == want[2] and got.life_action.tolist() == want[3]
    assert got.back.tolist() == want[4]
    assert list(got.again_at.items()) == want[5]  # the steps in the order first run, too
    assert at.saves == bytes(keeps and need for keeps, need in zip(scratch, layer_need))
