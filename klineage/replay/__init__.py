"""Replay: retrieve skills for a new kernel and search forward with them, beside two baselines.

The function `klineage.replay` lives in :mod:`klineage.replay.run`.
"""
