"""The GPU matrix: what the CPU tests cover, run on a device and compared with the CPU.

Each test takes ``device``: "gpu" (CuPy; marked ``gpu`` and skipped without a CUDA
device, so ``pytest -m gpu`` runs exactly that half) or "trace" (unroll.engine.trace: NumPy
behind CuPy's API, refusing implicit host conversions as CuPy does), so the tests' own
logic runs on every machine and a device only has to confirm it.
"""

import numpy as np
import pytest

import unroll
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
from unroll import Net, testing
from unroll.engine.backend import GPU_AVAILABLE, get_array_module, to_numpy
from unroll.tools.conllu import UPOS_TAGS
from unroll.train.bucketed_model import BucketedModel
from unroll.train.solver import Solver


@pytest.fixture(params=["trace", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "gpu" and not GPU_AVAILABLE:
        pytest.skip("no GPU: the gpu half of the matrix runs only where a CUDA device is present")
    return request.param


def with_loss(net_param, shape):
    """``net_param`` (output ``h`` of ``shape``) regressed onto an input ``y`` by EuclideanLoss."""
    target = net_param.layer.add(name="target", type="Input", top=["y"])
    target.input_param.shape.add().dim.extend(shape)
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "y"], top=["loss"])
    net_param.force_backward = True  # the gradient w.r.t. x is compared too
    return net_param


def recurrent(template, T=4, N=2, D=3, H=4, **kw):
    return with_loss(unroll.expand(template, steps=T, batch=N, input_dim=D, hidden=H, **kw),
                     (T, N, H))


def recurrent_batch(T=4, N=2, D=3, H=4, seed=0):
    rng = np.random.default_rng(seed)
    cont = np.ones((T, N))
    cont[0] = 0
    cont[2, 1] = 0  # a sequence boundary inside the batch
    return {"x": rng.normal(size=(T, N, D)), "cont": cont, "y": rng.normal(size=(T, N, H))}


def params_of(model):
    return [to_numpy(p.blob.data).copy() for p in model.learnable_params]


def assert_all_close(got, want, rtol, atol=0.0):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# -- layers -------------------------------------------------------------------------------

X = np.linspace(-2.3, 1.9, 12).reshape(3, 4)


@pytest.mark.parametrize("spec", [
    'type: "ReLU"', 'type: "ReLU" relu_param { negative_slope: 0.1 }', 'type: "Sigmoid"',
    'type: "TanH"', 'type: "Power" power_param { power: 2 scale: 0.5 shift: 3 }',
    'type: "Dropout" dropout_param { dropout_ratio: 0.3 }',
])
def test_neuron_backwards(device, spec):
    testing.check_layer_gradient(spec, [X], xp=get_array_module(device))


@pytest.mark.parametrize("op", ["SUM", "PROD"])
def test_eltwise_backward(device, op):
    coeff = " coeff: 2 coeff: -0.5 coeff: 1" if op == "SUM" else ""
    spec = f'type: "Eltwise" eltwise_param {{ operation: {op}{coeff} }}'
    testing.check_layer_gradient(spec, [X, X[::-1] + 3, 1 - X], xp=get_array_module(device))


def test_dropout_masks_and_scales_on_the_device(device):
    layer, (x,), (y,) = testing.run_layer(
        'type: "Dropout" dropout_param { dropout_ratio: 0.25 }', [np.ones((100, 40))],
        xp=get_array_module(device))
    out = to_numpy(y.data)
    kept = out != 0
    np.testing.assert_allclose(out[kept], 1 / 0.75)
    assert 0.7 < kept.mean() < 0.8
    y.diff[...] = get_array_module(device).asarray(np.full((100, 40), 2.0))
    layer.backward([y], [True], [x])
    np.testing.assert_allclose(to_numpy(x.diff), np.where(kept, 2 / 0.75, 0.0))


# -- nets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["lstm", "gru", "rnn", "lstm_primitive"])
def test_unrolled_nets_pass_the_gradient_check(device, template):
    net = Net(recurrent(template), dtype="float64", device=device, seed=1)
    for name, value in recurrent_batch().items():
        net.set_input(name, value)
    testing.check_net_gradient(net, wrt=["x"])


def run_lstm(device):
    net = Net(recurrent("lstm", T=5, N=3), dtype="float64", device=device, seed=2, keep=["h"])
    net.forward(**recurrent_batch(T=5, N=3, seed=3))
    net.clear_param_diffs()
    net.backward()
    return ([to_numpy(net.blobs["h"].data), to_numpy(net.blobs["x@0"].diff)]
            + [to_numpy(p.blob.diff) for p in net.learnable_params], net.loss)


def test_an_unrolled_lstm_agrees_with_the_cpu(device):
    got, loss = run_lstm(device)
    want, cpu_loss = run_lstm("cpu")
    assert_all_close(got, want, rtol=1e-10, atol=1e-12)
    assert loss == pytest.approx(cpu_loss, rel=1e-12)


def test_to_proto_and_copy_from_cross_devices(device):
    trained = Net(recurrent("lstm"), device=device, seed=4)
    host = Net(recurrent("lstm"), seed=5)
    host.copy_from(trained.to_proto())
    assert_all_close(params_of(host), params_of(trained), rtol=0)
    back = Net(recurrent("lstm"), device=device, seed=6)
    back.copy_from(host.to_proto())
    assert_all_close(params_of(back), params_of(host), rtol=0)


def test_bucketed_model_shares_one_store_on_the_device(device):
    def make(T):
        return recurrent("lstm", T=T)

    models = {d: BucketedModel(make, device=d, dtype="float64", seed=7) for d in (device, "cpu")}
    for model in models.values():
        solver = Solver(model, type="SGD", base_lr=0.3)
        for T in (3, 6, 3):
            solver.step(1, feed=recurrent_batch(T=T, seed=T))
        assert sorted(model.nets) == [1, 3, 6]
    got, want = models[device], models["cpu"]
    assert_all_close(params_of(got), params_of(want), rtol=1e-10)
    h = [model.forward(blobs=["h"], **recurrent_batch(T=5))["h"] for model in (got, want)]
    np.testing.assert_allclose(to_numpy(h[0]), to_numpy(h[1]), rtol=1e-10)


# -- the solver -----------------------------------------------------------------------------

RULES = {
    "SGD": dict(momentum=0.9),
    "Nesterov": dict(momentum=0.9),
    "AdaGrad": dict(delta=1e-8),
    "RMSProp": dict(rms_decay=0.98, delta=1e-8),
    "AdaDelta": dict(momentum=0.95, delta=1e-6, base_lr=1.0),
    "Adam": dict(momentum=0.9, momentum2=0.999, delta=1e-8),
}


def train(device, rule, steps, clip=None, decay=0.0, regularization="L2"):
    net = Net(recurrent("lstm"), dtype="float64", device=device, seed=8)
    fields = dict(base_lr=0.05, weight_decay=decay, regularization_type=regularization)
    fields.update(RULES[rule])
    if clip is not None:
        fields["clip_gradients"] = clip
    solver = Solver(net, type=rule, **fields)
    solver.step(steps, feed=lambda k: recurrent_batch(seed=k))
    return net, solver


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_update_rule_agrees_with_the_cpu(device, rule):
    got, _ = train(device, rule, 3, decay=1e-3)
    want, _ = train("cpu", rule, 3, decay=1e-3)
    assert_all_close(params_of(got), params_of(want), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("regularization", ["L2", "L1"])
def test_adam_with_clipping_agrees_over_several_steps(device, regularization):
    # a norm of 0.05 is far below the gradients here: every step is clipped
    got, solver = train(device, "Adam", 6, clip=0.05, decay=1e-2, regularization=regularization)
    want, cpu_solver = train("cpu", "Adam", 6, clip=0.05, decay=1e-2,
                             regularization=regularization)
    assert_all_close(params_of(got), params_of(want), rtol=1e-9, atol=1e-12)
    assert_all_close([to_numpy(h) for h in solver.history],
                     [to_numpy(h) for h in cpu_solver.history], rtol=1e-9, atol=1e-15)


def test_snapshot_and_restore_on_the_device(device, tmp_path):
    net, solver = train(device, "Adam", 2)
    _, state = solver.snapshot(tmp_path / "run")
    solver.step(1, feed=lambda k: recurrent_batch(seed=k))
    fresh = Net(recurrent("lstm"), dtype="float64", device=device, seed=9)
    restored = Solver(fresh, type="Adam", base_lr=0.05, **RULES["Adam"])
    restored.restore(state)
    assert restored.iter == 2
    restored.step(1, feed=lambda k: recurrent_batch(seed=k))
    assert_all_close(params_of(fresh), params_of(net), rtol=0)
    on_cpu = Solver(Net(recurrent("lstm"), dtype="float64", seed=9), type="Adam",
                    base_lr=0.05, **RULES["Adam"])
    on_cpu.restore(state)
    on_cpu.step(1, feed=lambda k: recurrent_batch(seed=k))
    assert_all_close(params_of(on_cpu.net), params_of(net), rtol=1e-10, atol=1e-14)


# -- the tagger -----------------------------------------------------------------------------


def tagger_run(device, tmp_path):
    """Two training steps of a small tagger, its scores, and its saved-and-loaded copy."""
    rng = np.random.default_rng(0)
    words = ["The", "cat", "sat", "on", "a", "mat", ".", "Dogs", "run", "fast", "!"]
    sentences = [[words[j] for j in rng.integers(0, len(words), n)] for n in (5, 3, 7, 4)]
    tags = [[UPOS_TAGS[j] for j in rng.integers(0, len(UPOS_TAGS), len(s))] for s in sentences]
    config = TaggerConfig(embed=8, hidden=6, batch=4, dropout=0.0, word_dropout=0.0,
                          feature_dims={"suffix2": 4}, chars={"embed": 5, "hidden": 4,
                                                             "length": 6})
    tagger = Tagger(Featurizer.build(sentences), config, device=device)
    inputs = tagger.inputs(tagger.encode(sentences), 7, tag_ids(tags), train=True)
    # SGD, not Adam: float32 rounding differs between devices, and Adam's normalized step
    # would turn a gradient entry that is rounding noise into a full-size step
    solver = Solver(tagger.train_model, type="SGD", base_lr=0.1, momentum=0.9,
                    clip_gradients=1.0)
    losses = [solver.step(1, feed=inputs) for _ in range(2)]
    predicted = tagger.predict(sentences)
    tagger.test_model.forward(**tagger.inputs(tagger.encode(sentences), 7))
    scores = to_numpy(tagger.test_model.active.blobs["scores"].data).copy()
    tagger.save(tmp_path / device)
    loaded = Tagger.load(tmp_path / device, device=device)
    return losses, scores, predicted, loaded.predict(sentences), params_of(tagger.train_model)


def test_a_tagger_trains_predicts_saves_and_loads_as_on_the_cpu(device, tmp_path):
    losses, scores, predicted, reloaded, params = tagger_run(device, tmp_path)
    cpu_losses, cpu_scores, _, _, cpu_params = tagger_run("cpu", tmp_path)
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-4)
    assert_all_close(params, cpu_params, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(scores, cpu_scores, rtol=1e-3, atol=1e-5)
    for a, b in zip(reloaded, predicted):
        np.testing.assert_array_equal(a, b)
