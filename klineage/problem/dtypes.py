"""The element types a definition may name, their sizes, and torch's spelling of them.

torch is imported only by :func:`torch_dtype`, so reading problems never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DTYPE_ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
SUPPORTED_DTYPES: tuple[str, ...] = tuple(_DTYPE_ITEMSIZE)
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})


def _check_dtype_name(name: str) -> None:
    if name not in _DTYPE_ITEMSIZE:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a supported dtype name (no torch needed)."""
    _check_dtype_name(name)
    return _DTYPE_ITEMSIZE[name]


def is_float_dtype(name: str) -> bool:
    """Whether a supported dtype name is a floating-point type."""
    _check_dtype_name(name)
    return name in FLOAT_DTYPES


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a supported dtype name; imports torch on first use only."""
    _check_dtype_name(name)
    import torch  # lazy: loading problems must not pay for (or require) torch

    return getattr(torch, name)
