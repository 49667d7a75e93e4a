"""CLI commands (data); filled in by the data work."""

from bertrain.cli.app import app  # noqa: F401
