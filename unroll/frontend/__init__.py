"""From a template to a NetParameter: loading, rendering, unrolling, Caffe export.

``template`` (finding and loading templates, the API their macros see),
``interface`` (one checker per template kind), ``render`` (the sandbox, the
macros, the parse cache; ``render_limits`` bounds rendering), ``builder`` (the
layers' names and the glue layers), ``recurrence`` (a recurrent layer in
time), ``shared`` (shared modules), ``tree`` and ``tree_unroller`` (trees,
level by level), ``checks`` (gating, declared shapes, initial blobs),
``unroller`` (``expand``; it registers itself with
:mod:`unroll.engine.hidden_nets` for Caffe's LSTM and RNN layers),
``caffe_export`` (lowering unroll-only layers to Caffe's), ``templates/`` (the
built-ins).
"""
