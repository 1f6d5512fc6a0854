"""Dependency relation labelling on UD English EWT given the gold tree: a sequence BiLSTM
baseline against a bidirectional tree-LSTM (``python -m examples.deprel train|evaluate|label``)."""
