"""The `klineage` command: one module per command group, wired together in :mod:`.main`."""

from klineage.cli.main import app

__all__ = ["app"]
