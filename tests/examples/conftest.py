"""A small made-up tagged corpus, so that training tests need no downloaded data."""

import numpy as np
import pytest

from unroll.tools.conllu import write_conllu
from unroll.tools.ewt import DEV_FILE, HOME_ENV, TRAIN_FILE
from unroll.tools.fetch import URL_ENV

WORDS = {
    "DET": ["the", "a", "this", "every"],
    "ADJ": ["big", "red", "old", "quiet"],
    "NOUN": ["cat", "dog", "house", "idea", "tree"],
    "VERB": ["sees", "likes", "finds", "eats"],
    "ADV": ["often", "never", "slowly"],
    "PUNCT": [".", "!"],
}
PATTERNS = [
    ["DET", "NOUN", "VERB", "DET", "NOUN", "PUNCT"],
    ["DET", "ADJ", "NOUN", "ADV", "VERB", "DET", "NOUN", "PUNCT"],
    ["DET", "NOUN", "VERB", "PUNCT"],
]
#: sizes that train in well under a second an epoch
TINY = {"embed": 8, "hidden": 8, "layers": 1, "batch": 8, "chars": {}, "dropout": 0.0,
        "word_dropout": 0.0, "feature_dims": {"suffix2": 4}}
TINY_ARGS = ["--embed", "8", "--hidden", "8", "--layers", "1", "--batch-size", "8",
             "--char-hidden", "0", "--dropout", "0", "--word-dropout", "0"]


@pytest.fixture(autouse=True, scope="session")
def no_download_beyond_localhost(tmp_path_factory):
    """A test that would fetch EWT by mistake finds a closed port on 127.0.0.1 and an empty
    cache of its own, never the internet nor the user's cache (data.py: the lookup order)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(URL_ENV, "http://127.0.0.1:9/no-such-mirror/")
        patch.setenv(HOME_ENV, str(tmp_path_factory.mktemp("data_home")))
        yield


def sentences(n: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tags = PATTERNS[rng.integers(len(PATTERNS))]
        out.append(([WORDS[t][rng.integers(len(WORDS[t]))] for t in tags], list(tags)))
    return out


def write_corpus(folder, n_train: int = 24, n_dev: int = 8):
    folder.mkdir(parents=True, exist_ok=True)
    for name, sents in ((TRAIN_FILE, sentences(n_train, 0)), (DEV_FILE, sentences(n_dev, 1))):
        write_conllu([f for f, _ in sents], [t for _, t in sents], folder / name)
    return folder


@pytest.fixture
def corpus(tmp_path):
    """A folder holding made-up EWT train and dev files."""
    return write_corpus(tmp_path / "data")


@pytest.fixture
def options():
    """``options(data, model_dir, **changes)``: TrainOptions of a tiny, quiet, 2-epoch run."""
    from examples.pos_tagging.train import TrainOptions

    def make(data, model_dir, **changes):
        settings = {"epochs": 2, "lr": 1e-2, "quiet": True, "sizes": dict(TINY)} | changes
        return TrainOptions(data=data, model_dir=model_dir, **settings)

    return make


@pytest.fixture
def tiny():
    """TaggerConfig fields of a tiny tagger."""
    return dict(TINY)


@pytest.fixture
def tiny_args():
    """Training command options of a tiny tagger."""
    return list(TINY_ARGS)
