"""The gate: build (nvcc), check (correctness), time (profile)."""
