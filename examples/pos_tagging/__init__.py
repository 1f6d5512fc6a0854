"""POS tagging on UD English EWT with unroll: read CoNLL-U, featurize, train, tag."""
