"""Composition root: configs, the CLI, wiring engine + storage + ui."""
