"""CLI commands (demo); filled in by the demo work."""

from bertrain.cli.app import app  # noqa: F401
