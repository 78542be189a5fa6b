"""klineage: mine verified GPU-kernel optimization skills from expert CUDA kernels."""

__version__ = "0.1.0"
