"""What a decision is made of, from the engine's candidate log scores to the built `Decision`.

- `result`: `Decision[T]`, `FieldResult`, `BatchTiming` and the seed-compatible response;
- `field_scores`: each field's `FieldResult` from its questions' candidate log scores;
- `bounds`: what a pruned field's partial scores guarantee;
- `joint`: the joint table of a `choices_by` parent and child (and a union's branches);
- `waves`: the questions of the next wave of dependent fields;
- `calibration`: the `Calibration` applied at decision time and its JSON file.

Nothing here runs the model: these modules sit between `prompt` and `engine`.
"""
