"""CLI commands (model); filled in by the model work."""

from bertrain.cli.app import app  # noqa: F401
