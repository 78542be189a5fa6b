"""Entry point of a GPU worker process: `python -m klineage.gate.worker_main FD [RUNNER]`.

A module of its own, so that the messages the worker unpickles are the classes of
`klineage.gate.worker` (not of `__main__`), and importing the package first is harmless.
"""

import sys

from klineage.gate.worker import DEFAULT_RUNNER, serve

if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else DEFAULT_RUNNER)
