"""
How a bad configuration value is reported: one `ConfigError` whose message is a single
line naming the key, the value and what is allowed, also for the JSON schema's errors.
"""

from __future__ import annotations

__all__ = ["ConfigError", "schema_error_line"]

#: Schema rules whose failure is said as "allowed: <the values, or type and bounds>".
BOUNDED = (
    "enum",
    "const",
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
)


class ConfigError(ValueError):
    """Bad configuration value; the message is one line: key, value, what is allowed."""


def schema_error_line(error) -> str:
    """One line for a `jsonschema.ValidationError`: key path, value and rule."""
    key = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}"
        for part in error.absolute_path
    ).lstrip(".")
    where = f"config key {key!r}" if key else "the configuration"
    if isinstance(error.instance, (str, int, float, bool)) or error.instance is None:
        where += f" = {error.instance!r}"
    message = error.message
    if error.validator == "pattern":  # a regular expression says little: describe it
        described = " ".join(error.schema.get("description", "").split())
        message = f"not allowed; allowed: {described}" if described else message
    elif error.validator in ("oneOf", "anyOf"):  # "not valid under any": say what is
        allowed = " or ".join(_describe(sub) for sub in error.validator_value)
        message = f"not allowed; allowed: {allowed}"
    elif error.validator in BOUNDED:  # jsonschema's "'x' is not one of [...]" and kin
        message = f"not allowed; allowed: {_describe(error.schema)}"
    elif error.validator == "minItems":  # "[] should be non-empty"
        message = f"not allowed; allowed: a list of {error.validator_value} or more"
    elif error.validator == "additionalProperties":
        known = ", ".join(error.schema.get("properties", {}))
        message += f"; allowed keys: {known}"
    return f"{where}: {message}"


def _describe(schema: dict) -> str:
    """A few words for a (sub)schema: its values, or its type and bounds."""
    if "enum" in schema:
        return ", ".join(str(v) for v in schema["enum"])
    kind = schema.get("type", "a value")
    words = {"integer": "an integer", "number": "a number", "string": "a string"}
    text = words.get(kind, str(kind))
    bounds = [
        f"{sign} {schema[name]}"
        for name, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if name in schema
    ]
    return text + (f" {' and '.join(bounds)}" if bounds else "")
