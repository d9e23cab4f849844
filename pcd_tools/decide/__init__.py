"""Deciding: the `Decider` users call and the orchestration of its engine calls.

- `decider`: `Decider` and the process-wide default decider;
- `scored`: the decisions of a schema whose fields are all scored;
- `generated`: the decisions of a schema with generated fields;
- `checks`: the argument checks shared by every decision call;
- `orders`: listing orders of the allowed values and their average;
- `contextual`: the label-free corrections (contextual calibration, PMI);
- `worker` and `aio`: the engine's single worker thread and the async micro-batcher;
- `seed`: the seed-compatible `run_parallel_generation`;
- `decorator`: the `@decision` class decorator (`Model.decide()`).

This package's `__init__` imports nothing, so `pcd_tools.decide.decorator` stays light.
"""
