"""The engine's C sources (`_*.c`: the CPU kernels, the GGUF block GEMM and dequantizer,
the native decode steps, the BLAS shim) and the Python modules that call them:
`cpu_ops` (exact attention, SwiGLU, RoPE for MLX's CPU backend) and `qgemm` (`x @ W^T`
over a matrix kept in its GGUF block encoding).
"""
