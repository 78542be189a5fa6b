"""The CUDA source model: tree-sitter parsing with masking, byte-range edits, C expressions,
launch facts and which functions the workloads run. Mechanisms are written over it."""
