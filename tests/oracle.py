"""An independent brute-force reference: one full prompt per candidate, plain `model(...)`.

It shares nothing with the engine but the token ids of the prompt and of each candidate
(`suffix + literal + terminator`, tokenized as a whole). No prefix cache, no packing, no
trie: each candidate's log score is the sum of full-vocabulary log-probabilities of its
tokens after the tokens all candidates share.
"""

from __future__ import annotations

import numpy as np

_PROMPT_CACHE: dict = {}


def candidate_sequences(decider, schema, field_name):
    from pcd_tools.prompt import candidate_text, terminator_for

    f = schema.field(field_name)
    term = terminator_for(schema)
    return [decider.engine.encode_ids(candidate_text(f, c.literal, term)) for c in f.choices]


def prompt_ids(decider, schema, context):
    plan = decider.engine.plan(schema)
    return plan.head_ids + decider.engine.encode_ids(context) + plan.tail_ids


def oracle_log_scores(
    decider, schema, context, field_name, only=None, batch=4, share_prompt=False, texts=None
):
    """z_c for each candidate (or the indices in `only`), from full prompts.

    With `texts`, the candidates are these full texts (e.g. earlier answers written before
    the field's suffix) instead of the field's own `suffix + literal + terminator`.

    With `share_prompt`, the prompt is prefilled once into mlx-lm's own `KVCache` and each
    candidate runs after it, trimmed back with `trim_prompt_cache` (DESIGN's sequential
    reference); used where thousands of full long prompts would be too slow.
    """
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    model = decider.engine.model
    prompt = prompt_ids(decider, schema, context)
    if texts is not None:
        seqs = [decider.engine.encode_ids(t) for t in texts]
    else:
        seqs = candidate_sequences(decider, schema, field_name)
    k = 0
    while all(len(s) > k and s[k] == seqs[0][k] for s in seqs):
        k += 1
    idx = list(range(len(seqs))) if only is None else list(only)
    out = {}
    if share_prompt:
        from mlx_lm.models.cache import KVCache, trim_prompt_cache

        key = (id(model), tuple(prompt))
        if key not in _PROMPT_CACHE:  # every candidate trims back to the prompt, so reuse it
            _PROMPT_CACHE.clear()
            # Plain KVCaches, not the model's own: gemma3's rotating caches cannot be trimmed
            # once past the window (trim_prompt_cache then trims nothing); a KVCache keeps
            # every key and masks the window itself.
            cache = [KVCache() for _ in model.layers]
            last = model(mx.array([prompt]), cache=cache)[0, -1].astype(mx.float32)
            mx.eval(last)
            _PROMPT_CACHE[key] = (cache, last)
        cache, last = _PROMPT_CACHE[key]
        for i in idx:
            s = seqs[i]
            logits = model(mx.array([s]), cache=cache)[0].astype(mx.float32)
            trim_prompt_cache(cache, len(s))
            logits = mx.concatenate([last[None], logits[:-1]], axis=0)  # logits predicting s[t]
            logp = log_softmax(logits)
            out[i] = sum(logp[t, s[t]] for t in range(k, len(s)))
        return np.array([out[i] for i in idx])
    for start in range(0, len(idx), batch):
        group = idx[start : start + batch]
        rows = [prompt + seqs[i] for i in group]
        width = max(len(r) for r in rows)
        arr = np.zeros((len(rows), width), dtype=np.int32)
        for j, r in enumerate(rows):
            arr[j, : len(r)] = r  # right padding never reaches real positions (causal)
        logits = model(mx.array(arr)).astype(mx.float32)
        logp = log_softmax(logits)
        for j, i in enumerate(group):
            s = seqs[i]
            base = len(prompt)
            out[i] = sum(logp[j, base + t - 1, s[t]] for t in range(k, len(s)))
    return np.array([out[i] for i in idx])


def log_softmax(logits):
    """Log-softmax over the last axis in float64 from float32 logits. Not MLX's
    `logsumexp`: on an AVX2 CPU (mlx 0.32.4) it was 1.8e-4 off the float64 value over a
    49,152-token vocabulary, more than the 1e-4 the parity tests allow."""
    x = np.asarray(logits, dtype=np.float32).astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (np.log(np.exp(x - m).sum(axis=-1, keepdims=True)) + m)


def softmax(z, temperature=1.0):
    z = np.asarray(z, dtype=np.float64) / temperature
    e = np.exp(z - z.max())
    return e / e.sum()
