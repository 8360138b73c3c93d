"""The built-in plugins, one module per concern; this directory installs as ``trainer.plugins``.

The project's layout keeps plugins at the top of the repository, beside ``trainer/``, so a reader
finds them where the guide says. Python finds them under another name: pyproject.toml's
``package-dir`` maps this directory to the package ``trainer.plugins``, which is the name imports,
entry points and tests use (docs/architecture.md). A plugin imports only ``trainer.plugin`` from
this project (docs/plugins.md).
"""
