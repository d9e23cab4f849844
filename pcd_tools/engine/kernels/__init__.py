"""The engine's C sources (`_*.c`: the CPU kernels, the GGUF block GEMM and dequantizer,
the native decode steps; `gguf_blocks.h`, the GGUF block types they share; `cpu_paths.h`,
their one CPU-feature dispatch) and the Python modules that call them: `bindings` (each
library loaded, its C signatures declared), `paths` and `gguf_types` (the two headers'
tables by name, for Python), `cpu_ops` (exact attention, SwiGLU, RoPE for MLX's CPU
backend) and `qgemm` (`x @ W^T` over a matrix kept in its GGUF block encoding).
"""
