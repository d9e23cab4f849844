"""The JSON schemas of OpenAI-style requests, compiled into PCD schemas.

`POST /v1/chat/completions` receives a JSON schema in one of two places:
`response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`
(`client.chat.completions.parse(response_format=Model)`, LangChain's
`with_structured_output(Model, method="json_schema")`), or a forced tool's `parameters`
(`method="function_calling"`). Either is what `Model.model_json_schema()` writes, in
OpenAI's strict form (`additionalProperties: false`, every property `required`, `$defs` and
`$ref`, `anyOf` with `{"type": "null"}`) or with the `$ref`s inlined (LangChain's function
form). `compile_json_schema` rebuilds it as a Pydantic model and compiles that, so a
schema scores exactly as the model it came from:

| JSON schema                                            | PCD field                              |
|--------------------------------------------------------|----------------------------------------|
| `enum` / `const` (str or int values), `type` optional  | enum of the values                     |
| `oneOf`/`anyOf` of `const`s, each with a `description` | enum, with per-choice descriptions     |
| `boolean`, or `enum: [true, false]`                    | boolean                                |
| `integer` with `minimum` and `maximum` (or             | ordered enum of the integers (2..255), |
| `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`)   | with an expected value                 |
| `anyOf: [X, {"type": "null"}]`, `type: [X, "null"]`,   | X, plus `null` ("not stated")          |
| `null` in an `enum`                                    |                                        |
| `object` with `properties`, inline or `$ref` into      | its fields, flattened (`customer.tier`)|
| `$defs` / `definitions`                                |                                        |
| `oneOf`/`anyOf` of objects with a `discriminator`      | a kind choice plus each branch's       |
| (`propertyName`), or a property that is a different    | fields (a discriminated union)         |
| `const` in every branch (what Pydantic writes)         |                                        |
| `array` of enum `items` (or a `$ref` to one),          | multi-label: each label scored yes/no  |
| `minItems`/`maxItems`, `uniqueItems`                   |                                        |
| `depends_on`, `choices_by`, `threshold`,               | carried over as in `json_schema_extra` |
| `choice_descriptions` keys in a property               |                                        |
| `title` / `description` of the top object              | the schema's name / instructions       |
| `description` of a property                            | the field's description                |

Generated (decoded under a grammar on the same cache, `FieldResult.probability` None):
`string` without `enum` (with `minLength`/`maxLength`, `pattern`, `format: date` /
`date-time`), `number`, an `integer` without a range, an `array` of `string` items.

`default`, `examples`, `required`, `additionalProperties: false`, `$schema` and other
annotations are accepted and ignored. Other `format`s, arrays of objects or numbers,
object maps (`additionalProperties: true` or a schema), `not`, `if`/`then`,
`patternProperties`, `allOf` of several schemas and unions without a discriminator raise
`UnsupportedSchemaKeywordError` (with the `keyword` and the JSON-pointer `path`); a malformed schema raises `InvalidJsonSchemaError`; more
fields than `max_fields` raise `SchemaTooLargeError`.

This module imports no web framework: it is the public path of the compiler that lives in
`pcd_tools.schema.json_schema`.
"""

from __future__ import annotations

from ..schema.json_schema import compile_json_schema, is_json_schema, json_schema_model

__all__ = ["compile_json_schema", "is_json_schema", "json_schema_model"]
