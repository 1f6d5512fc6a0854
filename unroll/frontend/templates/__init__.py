"""Built-in step and net templates (Jinja2 prototxt), shipped as the package unroll.frontend.templates."""
