"""Seeded inputs, poisoned outputs and the PyTorch reference, for any device.

Everything here is deterministic given (seed, workload uuid, tensor name), so a verdict can be
reproduced, and a second trial writes fresh values into the same buffers.
"""

from __future__ import annotations

import hashlib
import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from klineage.problem import Definition, ScalarInput, TensorSpec, Workload, torch_dtype

if TYPE_CHECKING:
    import torch

# Integer tensors without a declared range are drawn from [0, 64): small enough to be valid
# indices for most toy problems, large enough to catch index mix-ups.
DEFAULT_INT_RANGE = (0, 64)

_reference_cache: dict[str, Callable[..., Any]] = {}


class ReferenceFailure(RuntimeError):
    """The definition's reference failed or disagrees with the definition."""


def derive_seed(seed: int, *parts: str) -> int:
    """A 63-bit seed that depends on the base seed and on names, stable across processes."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def load_reference(definition: Definition) -> Callable[..., Any]:
    """Execute the reference source once (cached by content) and return its `run`."""
    key = hashlib.sha256(definition.reference.encode()).hexdigest()
    if key not in _reference_cache:
        module = types.ModuleType(f"klineage_reference_{definition.name}")
        code = compile(definition.reference, f"<reference of {definition.name}>", "exec")
        exec(code, module.__dict__)
        _reference_cache[key] = module.__dict__["run"]
    return _reference_cache[key]


def _bound(value: float | int | str, axis_values: dict[str, int]) -> float | int:
    return axis_values[value] if isinstance(value, str) else value


def _int_bounds(spec: TensorSpec, axis_values: dict[str, int]) -> tuple[int, int]:
    """[low, high) of an integer tensor: its declared range, else DEFAULT_INT_RANGE."""
    if spec.range is None:
        return DEFAULT_INT_RANGE
    low, high = (int(_bound(b, axis_values)) for b in spec.range)
    return low, high


def random_tensor(
    spec: TensorSpec, shape: tuple[int, ...], axis_values: dict[str, int], seed: int, device: str
) -> torch.Tensor:
    """Draw one tensor: normal floats (or uniform in `range`), integers in `range`, bits."""
    import torch

    dtype = torch_dtype(spec.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    if spec.dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen, device=device).bool()
    if dtype.is_floating_point:
        if spec.range is None:
            values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        else:
            low, high = (_bound(b, axis_values) for b in spec.range)
            values = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
            values = values * (high - low) + low
        return values.to(dtype)
    low, high = _int_bounds(spec, axis_values)
    return torch.randint(low, high, shape, generator=gen, device=device, dtype=dtype)


def fill_random_(
    tensor: torch.Tensor,
    spec: TensorSpec,
    axis_values: dict[str, int],
    generator: torch.Generator,
) -> None:
    """Overwrite a tensor in place with fresh values drawn as `random_tensor` draws them (the
    time stage's inputs change before every call without moving or allocating)."""
    import torch

    if spec.dtype == "bool" or not tensor.dtype.is_floating_point:
        low, high = (0, 2) if spec.dtype == "bool" else _int_bounds(spec, axis_values)
        scratch = torch.empty(tensor.shape, dtype=torch.int64, device=tensor.device)
        scratch.random_(low, high, generator=generator)
        tensor.copy_(scratch)
        return
    native = tensor.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    target = tensor if native else torch.empty(tensor.shape, device=tensor.device)
    if spec.range is None:
        target.normal_(generator=generator)
    else:
        low, high = (float(_bound(b, axis_values)) for b in spec.range)
        target.uniform_(low, high, generator=generator)
    if not native:
        tensor.copy_(target)


def refresh_inputs(
    definition: Definition,
    workload: Workload,
    inputs: dict[str, Any],
    generator: torch.Generator,
) -> None:
    """Fresh values for every tensor input, in the same buffers (scalars stay as given)."""
    axis_values = definition.axis_values(workload)
    for name, spec in definition.inputs.items():
        value = inputs[name]
        if hasattr(value, "copy_"):
            fill_random_(value, spec, axis_values, generator)


def make_inputs(
    definition: Definition, workload: Workload, seed: int, device: str
) -> dict[str, Any]:
    """Inputs for one trial, in definition order: tensors on `device`, scalars as Python values."""
    axis_values = definition.axis_values(workload)
    inputs: dict[str, Any] = {}
    for name, spec in definition.inputs.items():
        given = workload.inputs[name]
        if isinstance(given, ScalarInput):
            inputs[name] = given.value
            continue
        shape = definition.shape_of(spec, axis_values)
        inputs[name] = random_tensor(
            spec, shape, axis_values, derive_seed(seed, workload.uuid, name), device
        )
    return inputs


def refill_inputs(
    definition: Definition, workload: Workload, inputs: dict[str, Any], seed: int
) -> None:
    """Write a new trial's values into existing input buffers (same addresses, fresh values)."""
    fresh = make_inputs(definition, workload, seed, _device_of(inputs))
    for name, value in inputs.items():
        if hasattr(value, "copy_"):
            value.copy_(fresh[name])


def _device_of(inputs: dict[str, Any]) -> str:
    for value in inputs.values():
        if hasattr(value, "device"):
            return str(value.device)
    return "cpu"


def allocate_outputs(
    definition: Definition, workload: Workload, device: str
) -> dict[str, torch.Tensor]:
    import torch

    axis_values = definition.axis_values(workload)
    return {
        name: torch.empty(
            definition.shape_of(spec, axis_values), dtype=torch_dtype(spec.dtype), device=device
        )
        for name, spec in definition.outputs.items()
    }


def poison(tensor: torch.Tensor) -> None:
    """Fill an output with values no correct kernel leaves behind: NaN, or the integer minimum."""
    import torch

    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        # bool has no spare value; alternate bits make an unwritten output unlikely to match
        tensor.copy_(torch.arange(tensor.numel(), device=tensor.device).reshape(tensor.shape) % 2)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).min)


def axis_keywords(definition: Definition, axis_values: dict[str, int] | None) -> dict[str, int]:
    """Values for the reference's keyword-only parameters that are named after axes."""
    run = load_reference(definition)
    wanted = [
        p.name
        for p in inspect.signature(run).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in definition.axes
    ]
    if wanted and axis_values is None:
        raise ReferenceFailure(f"the reference wants axis values {wanted}; none were given")
    return {name: (axis_values or {})[name] for name in wanted}


def run_reference(
    definition: Definition, inputs: dict[str, Any], axis_values: dict[str, int] | None = None
) -> dict[str, torch.Tensor]:
    """Call the reference on copies of the inputs (and the axis values its keyword-only
    parameters name); check how many outputs it returns."""
    import torch

    run = load_reference(definition)
    args = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs.values()]
    keywords = axis_keywords(definition, axis_values)
    try:
        with torch.no_grad():
            result = run(*args, **keywords)
    except Exception as err:
        raise ReferenceFailure(f"the reference of {definition.name} raised {err!r}") from err
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    names = list(definition.outputs)
    if len(outputs) != len(names):
        raise ReferenceFailure(
            f"the reference returned {len(outputs)} value(s); the definition has "
            f"{len(names)} output(s): {', '.join(names)}"
        )
    return dict(zip(names, outputs, strict=True))


def check_reference_outputs(
    definition: Definition, workload: Workload, outputs: dict[str, torch.Tensor]
) -> None:
    """Raise ReferenceFailure when the reference's outputs disagree with the declared specs."""
    axis_values = definition.axis_values(workload)
    for name, spec in definition.outputs.items():
        value = outputs[name]
        expected_shape = definition.shape_of(spec, axis_values)
        if tuple(value.shape) != expected_shape:
            raise ReferenceFailure(
                f"reference output {name!r} has shape {tuple(value.shape)}; the definition "
                f"says {expected_shape} for {workload.label}"
            )
        if value.dtype != torch_dtype(spec.dtype):
            raise ReferenceFailure(
                f"reference output {name!r} has dtype {value.dtype}; the definition says "
                f"{spec.dtype}"
            )
