"""The ground every part stands on: errors, atomic file writes, bounded and schema-checked
JSON (``json_files``), and Caffe's protobuf messages.

Nothing here knows about nets or templates; every other package may import it.
"""
