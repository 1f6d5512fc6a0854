"""Tree-LSTM training throughput: level-batched (every tree of a batch at once) against one
tree at a time, in nodes per second.

Both run forward and backward of a bidirectional child-sum Tree-LSTM
(``child_sum_tree_lstm``, D=100, H=100) with a EuclideanLoss, over the first
sentences of UD English EWT train (or random trees where the data is absent),
through :class:`~unroll.train.tree_model.TreeModel`: batches of ``--batch`` trees from
:class:`~unroll.train.tree_sampler.TreeBucketSampler` (level by level, one net per
widths bucket), against batches of one tree. A first pass builds the nets; the
second is timed. A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_trees                  (from the repository root)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from unroll.frontend.template import load_template
from unroll.frontend.tree import Tree
from unroll.frontend.tree_unroller import expand_tree, tree_inputs
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


def nodes_per_second(trees, batch: int, dim: int, hidden: int) -> tuple[float, int]:
    sampler = TreeBucketSampler(trees, batch, "bidirectional", shuffle=False, group=8)
    template = load_template(TEMPLATE)
    model = TreeModel(lambda w: with_loss(expand_tree(TEMPLATE, w, input_dim=dim, hidden=hidden,
                                                      direction="bidirectional"), 2 * hidden),
                      canonical=((1,), (1,)))
    rng = np.random.default_rng(0)
    plan = []
    for b, key in zip(sampler.epoch_batches(0), sampler.epoch_keys(0)):
        rows = max(sum(w) for w in key)
        inputs = tree_inputs([trees[i] for i in b], template, key, "bidirectional", rows)
        plan.append((key, {**inputs, "x": rng.normal(size=(rows, dim))}))

    def epoch():
        for key, inputs in plan:
            model.clear_param_diffs()
            model.forward(widths=key, **inputs)
            model.backward()

    epoch()  # builds the nets
    start = time.perf_counter()
    epoch()
    return sum(len(t) for t in trees) / (time.perf_counter() - start), len(model.nets)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=int, default=640)
    parser.add_argument("--single-trees", type=int, default=64,
                        help="trees run one at a time (they are slow)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=100)
    args = parser.parse_args(argv)
    trees = forest(args.trees)
    batched, nets = nodes_per_second(trees, args.batch, args.dim, args.hidden)
    single, single_nets = nodes_per_second(trees[: args.single_trees], 1, args.dim, args.hidden)
    print(f"level-batched, {args.batch} trees a batch: {batched:,.0f} nodes/s ({nets} nets)")
    print(f"one tree at a time: {single:,.0f} nodes/s ({single_nets} nets); "
          f"batched is {batched / single:.1f}x")


if __name__ == "__main__":
    main()
