"""Built-in step and net templates (Jinja2 prototxt), shipped as a package of their own."""
