"""The machine under the engine: usable CPUs and their load, the BLAS bound into MLX
before `import mlx.core`, and building native code into the user cache.

Nothing here knows about models or schemas; every other room of the engine sits on it.
"""
