"""The PCD passes of a request: the plan and pack of a schema (`pack`), candidate tries
(`trie`), the prefill and fields passes (`forward`), certified pruning (`prune`), later
waves of dependent fields (`waves`), the schema-prefix KV cache (`prefix_cache`), K/V kept
in parts (`kv_parts`) and the CPU stream workers that run a pass's jobs (`workers`).
"""
