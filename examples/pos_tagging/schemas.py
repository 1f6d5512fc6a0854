"""The tagger's JSON files: what config.json and features.json may hold, and log.json's entries.

Read through :func:`unroll.core.json_files.read_checked`, which bounds a file and
names the field a value breaks:

>>> from unroll.core.json_files import problem
>>> problem({"hidden": 0}, CONFIG_SCHEMA)
'hidden must be an integer >= 1, found 0'
>>> problem({"chars": {"length": 10**9, "embed": 8, "hidden": 8}}, CONFIG_SCHEMA)
'chars.length must be at most 256, found 1000000000'
"""

from __future__ import annotations

from examples.pos_tagging.features import FEATURES
from unroll.core.json_files import count, finite, ratio
from unroll.train import model_folder
from unroll.train.model_folder import ModelFiles
from unroll.train.trainer import log_schema

#: entries of one vocabulary (EWT's largest, words, has about 16k)
MAX_VOCAB = 5_000_000
#: the largest embedding, hidden or batch size a config may ask for (the default hidden
#: is 256; whether a net of such sizes fits in memory is for the net to check)
MAX_WIDTH = 8192

#: a TaggerConfig (config.json): sizes within what a tagger can use, far above any real one
CONFIG_SCHEMA = {
    "type": "object",
    "description": "an object {...}",
    "additionalProperties": False,
    "properties": {
        "embed": count(MAX_WIDTH), "hidden": count(MAX_WIDTH), "layers": count(16),
        "batch": count(MAX_WIDTH),
        "cell": {"type": "string", "minLength": 1, "maxLength": 4096,
                 "description": "a template name"},
        "dropout": ratio(), "word_dropout": ratio(),
        "feature_dims": {"type": "object", "description": "an object",
                         "propertyNames": {"enum": list(FEATURES)},
                         "additionalProperties": count(MAX_WIDTH)},
        "chars": {
            "type": "object", "description": "{} or an object with embed, hidden, length",
            "additionalProperties": False,
            "properties": {"embed": count(MAX_WIDTH), "hidden": count(MAX_WIDTH),
                           "length": count(256)},
            "dependentRequired": {"embed": ["hidden", "length"], "hidden": ["embed", "length"],
                                  "length": ["embed", "hidden"]},
        },
    },
}

#: one vocabulary {tokens, counts} of features.json
VOCAB_SCHEMA = {
    "type": "object", "description": "a vocabulary {tokens, counts}",
    "required": ["tokens", "counts"], "additionalProperties": False,
    "properties": {
        "tokens": {"type": "array", "maxItems": MAX_VOCAB, "description": "a list of strings",
                   "items": {"type": "string", "description": "a string"}},
        "counts": {"type": "array", "maxItems": MAX_VOCAB, "description": "a list of counts",
                   "items": {"type": "integer", "minimum": 0, "maximum": 1 << 53,
                             "description": "a count (an integer >= 0)"}},
    },
}

#: a Featurizer (features.json)
FEATURES_SCHEMA = {
    "type": "object", "description": "an object {features, chars}",
    "required": ["features", "chars"], "additionalProperties": False,
    "properties": {
        "features": {"type": "object", "description": "an object of vocabularies",
                     "required": list(FEATURES), "additionalProperties": False,
                     "properties": dict.fromkeys(FEATURES, VOCAB_SCHEMA)},
        "chars": VOCAB_SCHEMA,
    },
}

#: log.json: the Trainer's epoch records with the tagger's dev UPOS and padding
LOG_SCHEMA = log_schema({"dev_accuracy": finite(1), "padding_fraction": finite(1)},
                        required=["dev_accuracy"])

#: the tagger's model folder: its log and its two JSON files, which log.json checksums
TAGGER_FILES = ModelFiles(LOG_SCHEMA, {model_folder.CONFIG: CONFIG_SCHEMA,
                                        model_folder.FEATURES: FEATURES_SCHEMA})
