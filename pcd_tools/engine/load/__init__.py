"""Getting a model in: model sources (`sources`: the embedded model, a GGUF file, an MLX
directory, a Hugging Face id), the GGUF reader (`gguf`) and its architecture families
(`families`), quantized linear layers kept in the file's encoding (`qlinear`, `gguf_mlp`)
and the tokenizer rebuilt from a GGUF's metadata (`tokenizer`).
"""
