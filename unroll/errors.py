"""The errors unroll raises for bad nets, templates and data."""


class NetError(ValueError):
    """A net that cannot be built or run: names the layer, blob and shapes involved."""


class TemplateError(ValueError):
    """A template that cannot be expanded: names the template, line and offending name."""
