"""`python -m klineage` is the `klineage` command."""

from klineage.cli import app

app(prog_name="klineage")
