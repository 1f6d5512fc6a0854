"""Built-in step and net templates (Jinja2 prototxt), shipped inside the package as unroll.templates."""
