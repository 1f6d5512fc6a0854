"""Layer implementations, one module per family; importing the package registers them all.

Every module in this folder is imported here, so a new layer type is one new
module with a ``@register_layer`` class: there is no list to extend.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
