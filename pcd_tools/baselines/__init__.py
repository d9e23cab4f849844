"""What PCD is compared with: generating the answer instead of scoring it.

- `generation`: greedy and grammar-constrained generation on the MLX model;
- `json_answer`: reading a generated JSON answer back into field values;
- `llama_cpp`: the same generation on llama.cpp (the `peer` in `pcd bench`).

Only `bench/` and `eval/` use these; the core never does.
"""
