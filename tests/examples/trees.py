"""A small made-up corpus of dependency trees, so that deprel's tests need no downloaded data.

Subject, object and oblique are all nouns under the verb: only their side and their
dependents tell them apart, so a labeller has something to learn.
"""

import numpy as np

from unroll.tools.ewt import DEV_FILE, TRAIN_FILE

WORDS = {"DET": ["the", "a"], "ADJ": ["big", "red", "old"], "NOUN": ["dog", "cat", "park",
         "man", "ball"], "VERB": ["sees", "likes", "kicks"], "ADP": ["in", "near"]}


def sentence(rng) -> list[tuple]:
    """(form, upos, head, deprel) rows of "DET (ADJ) NOUN VERB DET (ADJ) NOUN (ADP DET (ADJ)
    NOUN)": subject, object and oblique are all nouns under the verb; only their side and
    their dependents tell them apart."""
    rows = []  # (upos, head, deprel), heads 1-based

    def phrase(rel, head, case=False):
        """Append [ADP] DET [ADJ] NOUN, the noun under ``head``; return the noun's id."""
        first = len(rows) + 1
        adj = bool(rng.random() < 0.5)
        noun = first + case + 1 + adj
        if case:
            rows.append(("ADP", noun, "case"))
        rows.append(("DET", noun, "det"))
        if adj:
            rows.append(("ADJ", noun, "amod"))
        rows.append(("NOUN", head, rel))
        return noun

    # the verb follows the subject phrase: 3 words, or 4 with an adjective
    verb = 3 + bool(rng.random() < 0.5)
    rows.append(("DET", verb - 1, "det"))
    if verb == 4:
        rows.append(("ADJ", verb - 1, "amod"))
    rows.append(("NOUN", verb, "nsubj"))
    rows.append(("VERB", 0, "root"))
    phrase("obj", verb)
    if rng.random() < 0.5:
        phrase("obl", verb, case=True)
    return [(str(rng.choice(WORDS[u])), u, h, d) for u, h, d in rows]


def conllu(sentences, multiword=False) -> str:
    out = []
    for k, rows in enumerate(sentences):
        out.append(f"# sent_id = {k + 1}\n")
        if multiword:
            out.append(f"1-2\t{rows[0][0]}{rows[1][0]}\t_\t_\t_\t_\t_\t_\t_\t_\n")
        for i, (form, upos, head, rel) in enumerate(rows, start=1):
            out.append(f"{i}\t{form}\t{form}\t{upos}\t_\t_\t{head}\t{rel}\t_\t_\n")
        if multiword:
            out.append(f"{len(rows)}.1\tx\t_\t_\t_\t_\t_\t_\t{len(rows)}:dep\t_\n")
        out.append("\n")
    return "".join(out)


def write_trees(folder, n_train=24, n_dev=8, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAIN_FILE).write_text(conllu([sentence(rng) for _ in range(n_train)]))
    (folder / DEV_FILE).write_text(conllu([sentence(rng) for _ in range(n_dev)],
                                           multiword=True))
    return folder
