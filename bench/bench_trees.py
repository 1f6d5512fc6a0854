"""Tree-LSTM training throughput: level-batched (every tree of a batch at once) against one
tree at a time, in nodes per second.

Both train a bidirectional child-sum Tree-LSTM (``child_sum_tree_lstm``, D=100,
H=100) with a EuclideanLoss: forward, backward and an Adam step a batch, over
the first sentences of UD English EWT train (or random trees where the data is
absent), through :class:`~unroll.train.tree_model.TreeModel`: batches of
``--batch`` trees from :class:`~unroll.train.tree_sampler.TreeBucketSampler`
(level by level, one net per widths bucket, shuffled per epoch as training
does), against batches of one tree. Epoch 0 builds the nets; epoch 1 is timed
(``--repeat`` passes over its batches, the first with the nets it builds of its
own; the median pass, and the fastest). The inputs of each batch are made
before the clock starts. Printed: nodes/s, nets built per epoch, the padding
fraction, and the process's peak RSS. A benchmark, not a test: run it on an
idle machine.

``--chains 100,400,1600,3000`` times instead what deprel ``label`` does with one
long sentence: expand the bidirectional net of one tree (the expansion builds it
once, to check it), build it for the test phase and run it forward, for a chain
of that many words (each word the head of the next: as many levels as words)
and for a flat tree (every word under the root: two levels). Printed: seconds,
levels and layers of each; a chain costs what its words do.

``--plan FILE`` writes the timed epoch's batches (each tree's parents) for
``bench/bench_trees_torch.py``, which trains the same Tree-LSTM in PyTorch on
the same batches; ``--dump FILE`` writes a few trees, their inputs, weights and
this side's outputs (float64), which ``bench_trees_torch.py --check`` compares
with its own.

    python -m bench.bench_trees --plan plan.json     (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from unroll.engine.net import Net
from unroll.frontend.template import load_template
from unroll.frontend.tree import Tree
from unroll.frontend.tree_unroller import expand_tree, tree_inputs, tree_widths
from unroll.train.solver import Solver
from unroll.train.tree_model import TreeModel
from unroll.train.tree_sampler import TreeBucketSampler

TEMPLATE = "child_sum_tree_lstm"
EWT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_english_ewt"


def forest(n: int, seed: int = 0) -> list[Tree]:
    train = EWT / "en_ewt-ud-train.conllu"
    if train.is_file():
        from examples.deprel.conll import read_deprel

        return [s.tree for s in read_deprel(train)[:n]]
    rng = np.random.default_rng(seed)
    return [Tree([-1] + [int(rng.integers(max(0, i - 4), i)) for i in range(1, m)])
            for m in rng.integers(5, 40, size=n)]


def with_loss(net_param, width: int):
    rows = net_param.layer[0].input_param.shape[0].dim[0]
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[rows, width])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    return net_param


def tree_model(dim: int, hidden: int, dtype: str = "float32") -> TreeModel:
    return TreeModel(lambda w: with_loss(expand_tree(TEMPLATE, w, input_dim=dim, hidden=hidden,
                                                     direction="bidirectional"), 2 * hidden),
                     canonical=((1,), (1,)), dtype=dtype)


def train_epochs(trees, batch: int, dim: int, hidden: int, repeat: int = 1) -> dict:
    """Train epoch 0 (untimed, it builds most nets), then epoch 1's batches ``repeat`` times
    (timed: nodes/s of the median and of the fastest pass); the figures of both."""
    sampler = TreeBucketSampler(trees, batch, "bidirectional", shuffle=True, group=8)
    template = load_template(TEMPLATE)
    model = tree_model(dim, hidden)
    solver = Solver(model, type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.999,
                    delta=1e-8)
    rng = np.random.default_rng(0)
    figures = {"nets_built": [], "padding_fraction": [], "batches": []}
    for epoch in range(2):
        plan = []
        for b, key in zip(sampler.epoch_batches(epoch), sampler.epoch_keys(epoch)):
            rows = max(sum(w) for w in key)
            inputs = tree_inputs([trees[i] for i in b], template, key, "bidirectional", rows)
            plan.append((key, {**inputs, "x": rng.normal(size=(rows, dim))}))
        before = len(model.nets)
        seconds = []
        for _ in range(repeat if epoch else 1):
            start = time.perf_counter()
            for key, inputs in plan:
                model.clear_param_diffs()
                model.forward(widths=key, **inputs)
                model.backward()
                solver.update()
            seconds.append(time.perf_counter() - start)
            if len(seconds) == 1:
                figures["nets_built"].append(len(model.nets) - before)
        figures["padding_fraction"].append(sampler.padding_fraction(epoch))
        figures["batches"].append(sampler.epoch_batches(epoch))
    nodes = sum(len(t) for t in trees)
    figures["nodes_per_s"] = nodes / statistics.median(seconds)
    figures["best_nodes_per_s"] = nodes / min(seconds)
    figures["keys"] = len(sampler.keys(1))
    return figures


def write_plan(path: Path, trees, batches, dim: int, hidden: int) -> None:
    """The timed epoch's batches, each a list of trees' parents, for bench_trees_torch."""
    plan = {"dim": dim, "hidden": hidden,
            "batches": [[trees[i].parents.tolist() for i in b] for b in batches]}
    Path(path).write_text(json.dumps(plan))


def write_dump(path: Path, trees, dim: int, hidden: int, seed: int = 0) -> None:
    """A batch of ``trees``, random x and weights, and this side's h and the gradients of
    its EuclideanLoss against 0 (float64)."""
    model = tree_model(dim, hidden, "float64")
    rng = np.random.default_rng(seed)
    for p in model.learnable_params:
        p.data[...] = rng.normal(scale=0.5, size=p.data.shape)
    key = tree_widths(trees, "bidirectional")
    rows = max(sum(w) for w in key)
    x = rng.normal(size=(rows, dim))
    inputs = tree_inputs(trees, load_template(TEMPLATE), key, "bidirectional", rows)
    n = sum(len(t) for t in trees)  # == rows: real widths, so the loss is over nodes alone
    h = model.forward(widths=key, blobs=["h"], x=x, target=np.zeros((rows, 2 * hidden)),
                      **inputs)["h"]
    model.clear_param_diffs()
    model.backward()
    parents = np.concatenate([t.parents for t in trees])
    sizes = np.array([len(t) for t in trees])
    np.savez(path, x=x[:n], h=np.asarray(h)[:n], parents=parents, sizes=sizes,
             **{p.name: p.data for p in model.learnable_params},
             **{f"grad_{p.name}": p.diff for p in model.learnable_params})


def label_one(tree: Tree, dim: int, hidden: int) -> tuple[float, int, int]:
    """(seconds, levels, layers) to expand, build and run the net of one ``tree``."""
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    widths = tree_widths([tree], "bidirectional")
    net_param = expand_tree(TEMPLATE, widths, input_dim=dim, hidden=hidden,
                            direction="bidirectional")
    net = Net(net_param, phase="test")
    inputs = tree_inputs([tree], load_template(TEMPLATE), widths, "bidirectional")
    net.forward(x=rng.normal(size=(len(tree), dim)), **inputs)
    return time.perf_counter() - start, len(widths[0]), len(net_param.layer)


def chains_against_flat(lengths, dim: int, hidden: int) -> None:
    for n in lengths:
        chain = label_one(Tree.from_heads([0, *range(1, n)]), dim, hidden)
        flat = label_one(Tree.from_heads([0, *([1] * (n - 1))]), dim, hidden)
        print(f"{n:5d} words: chain {chain[0]:7.2f} s ({chain[1]} levels, {chain[2]:,} layers); "
              f"flat tree {flat[0]:5.2f} s ({flat[1]} levels, {flat[2]:,} layers)", flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=int, default=640)
    parser.add_argument("--single-trees", type=int, default=64,
                        help="trees run one at a time (they are slow); 0: skip")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="timed passes over epoch 1")
    parser.add_argument("--plan", type=Path, help="write the timed epoch's batches here")
    parser.add_argument("--dump", type=Path, help="write a check batch for bench_trees_torch "
                                                  "--check here, and stop")
    parser.add_argument("--chains", metavar="WORDS",
                        help="time one chain and one flat tree of each of these lengths "
                             "(comma-separated), as deprel label runs them, and stop")
    args = parser.parse_args(argv)
    if args.chains:
        chains_against_flat([int(n) for n in args.chains.split(",")], args.dim, args.hidden)
        return
    trees = forest(args.trees)
    if args.dump:
        write_dump(args.dump, [t for t in trees if 1 < len(t) < 12][:4], 5, 4)
        print(f"wrote {args.dump}")
        return
    batched = train_epochs(trees, args.batch, args.dim, args.hidden, args.repeat)
    if args.plan:
        write_plan(args.plan, trees, batched["batches"][1], args.dim, args.hidden)
    print(f"level-batched, {args.batch} trees a batch: {batched['nodes_per_s']:,.0f} nodes/s "
          f"(fastest pass {batched['best_nodes_per_s']:,.0f}; train: forward, backward, Adam); "
          f"{sum(len(t) for t in trees)} nodes in "
          f"{len(trees)} trees; nets built in epochs 0, 1: {batched['nets_built']} "
          f"({batched['keys']} keys in epoch 1, {len(batched['batches'][1])} batches); padding "
          f"{100 * batched['padding_fraction'][1]:.1f}%; peak RSS {peak_rss_mb():.0f} MB")
    if args.single_trees:
        single = train_epochs(trees[: args.single_trees], 1, args.dim, args.hidden)
        print(f"one tree at a time: {single['nodes_per_s']:,.0f} nodes/s (nets built in "
              f"epochs 0, 1: {single['nets_built']}); batched is "
              f"{batched['nodes_per_s'] / single['nodes_per_s']:.1f}x")


if __name__ == "__main__":
    main()
