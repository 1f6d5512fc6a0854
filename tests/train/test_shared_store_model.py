"""What every model of several nets over one store does alike (unroll/train/shared_store_model.py,
docs/design.md, 10. Training): no loss and no backward before a forward, and weights saved
through one net load into a twin whichever net ran."""

import numpy as np
import pytest

from unroll import expand
from unroll.frontend.tree_unroller import expand_tree
from unroll.train.bucketed_model import BucketedModel
from unroll.train.tree_model import TreeModel


def bucketed(seed: int) -> BucketedModel:
    return BucketedModel(lambda T: expand("lstm", steps=T, batch=2, input_dim=3, hidden=4),
                         seed=seed)


def tree(seed: int) -> TreeModel:
    return TreeModel(lambda w: expand_tree("nary_tree_lstm", w, input_dim=3, hidden=4), (1,),
                     seed=seed)


#: (a model, the inputs of a forward through a net that is not its canonical one)
MODELS = {
    "bucketed": (bucketed, dict(x=np.ones((3, 2, 3)), cont=np.ones((3, 2)))),
    "tree": (tree, dict(widths=(2, 1), x=np.ones((3, 3)))),
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_before_a_forward_there_is_no_loss_and_no_backward(kind):
    model = MODELS[kind][0](0)
    assert model.loss == 0.0
    with pytest.raises(RuntimeError, match=rf"^{type(model).__name__}\.backward before forward$"):
        model.backward()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_weights_saved_after_any_forward_load_into_a_twin(kind, tmp_path):
    make, inputs = MODELS[kind]
    model, twin = make(0), make(1)
    first = model.forward(**inputs)["h"].copy()
    assert not np.array_equal(twin.forward(**inputs)["h"], first)
    model.save(tmp_path / "w.caffemodel")
    twin.copy_from(tmp_path / "w.caffemodel")
    np.testing.assert_array_equal(twin.forward(**inputs)["h"], first)
    assert [p.blob.data.tolist() for p in twin.learnable_params] == [
        p.blob.data.tolist() for p in model.learnable_params]


def test_a_model_must_say_which_net_is_canonical():
    from unroll.train.shared_store_model import SharedStoreModel

    class Unsaid(SharedStoreModel):
        pass

    with pytest.raises(TypeError, match="_canonical"):
        Unsaid()
