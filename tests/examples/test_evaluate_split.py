"""`evaluate --split dev|test`: a split of the data folder in place of a file, dev where
neither is given (unroll.tools.app_cli's split group, as the tagger's __main__.py uses it)."""

import pytest

from examples.pos_tagging.__main__ import main
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.tagger import Tagger, TaggerConfig
from tests.cli_helpers import one_line_error
from unroll.tools.conllu import read_conllu, write_conllu
from unroll.tools.ewt import DEV_FILE, TEST_FILE, TRAIN_FILE


@pytest.fixture
def model_dir(corpus, tmp_path, tiny):
    """An untrained tiny tagger saved as best and last."""
    forms = [f for f, _ in read_conllu(corpus / TRAIN_FILE)]
    tagger = Tagger(Featurizer.build(forms), TaggerConfig(**tiny))
    for name in ("best", "last"):
        tagger.save(tmp_path / "m", name)
    return tmp_path / "m"


def scored_tokens(out: str) -> int:
    first = out.splitlines()[0]
    assert first.startswith("UPOS accuracy: "), first
    return int(first.split(" of ")[1].split()[0])


@pytest.mark.parametrize("split", ["dev", "test"])
def test_a_split_of_the_data_folder_is_scored(split, corpus, model_dir, capsys):
    write_conllu([["a", "red", "tree", "."]], [["DET", "ADJ", "NOUN", "PUNCT"]],
                 corpus / TEST_FILE)
    argv = ["evaluate", "--model-dir", str(model_dir), "--data", str(corpus)]
    assert main([*argv, "--split", split]) == 0
    by_split = capsys.readouterr().out
    file = corpus / {"dev": DEV_FILE, "test": TEST_FILE}[split]
    assert scored_tokens(by_split) == sum(len(f) for f, _ in read_conllu(file))
    assert main([*argv, str(file)]) == 0
    assert capsys.readouterr().out == by_split


def test_a_data_folder_without_the_test_split_is_an_error_naming_the_file(corpus, model_dir,
                                                                           capsys):
    argv = ["evaluate", "--model-dir", str(model_dir), "--data", str(corpus), "--split", "test"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{corpus / TEST_FILE} not found: the data folder {corpus} has no test split" in err


def test_evaluate_scores_dev_where_given_neither_a_file_nor_a_split(corpus, model_dir, capsys):
    argv = ["evaluate", "--model-dir", str(model_dir), "--data", str(corpus)]
    assert main([*argv, "--split", "dev"]) == 0
    by_split = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == by_split


def test_evaluate_takes_a_file_or_a_split_not_both(corpus, model_dir, capsys):
    argv = ["evaluate", "--model-dir", str(model_dir), str(corpus / DEV_FILE), "--split", "dev"]
    assert main(argv) == 2
    one_line_error(capsys, "give either a CoNLL-U FILE or --split, not both")
