"""From a step template to a NetParameter: templates, the unroller, Caffe export.

``template`` (finding, loading and checking templates; ``render_limits`` bounds
their rendering), ``unroller`` (expansion to T steps; it registers itself with
:mod:`unroll.engine.hidden_nets` for Caffe's LSTM and RNN layers),
``caffe_export`` (lowering unroll-only layers to Caffe's), ``templates/`` (the
built-ins).
"""
