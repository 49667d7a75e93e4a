"""CLI commands (train); filled in by the train work."""

from bertrain.cli.app import app  # noqa: F401
