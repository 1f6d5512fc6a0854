"""What a person runs: the ``unroll`` command, drawing, the layer catalogue, Caffe rewriting.

``cli`` (``unroll expand|inspect|memory|draw|layers|check``), ``draw``
(Graphviz), ``catalogue`` (``unroll layers``), ``caffe_prototxt`` (a Caffe net
with its LSTM and RNN layers written out), ``output`` (``-o`` and standard output,
for every command), ``conllu`` (CoNLL-U, every other byte kept), ``ewt`` and
``fetch`` (where UD English EWT is, and fetching it).
"""
