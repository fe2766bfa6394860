"""The console script `perfmodel` (pyproject.toml [project.scripts]): the app is built in perfmodel/cli/app.py."""

from perfmodel.cli.app import app, main

__all__ = ["app", "main"]
