"""Schemathesis hooks for aptix-worker's CI run.

- Batches are NDJSON (one BatchLine per line): teach the fuzzer to send them.
- Two answers are NDJSON too (a batch's results, the streamed synchronous turn), documented
  with the schema of one line: every line is checked against it, since schemathesis validates
  one value per answer.
- Two request rules cannot be said in JSON Schema (the schema's description names them):
  `resultJson` holds a JSON text, and base64 artifacts must decode. Generated bodies
  (every phase) are mended to respect them, so the "schema-valid request rejected" check only
  fires for rules the document could have stated.
- Whether a webhook URL is accepted depends on the server's signing secrets and on where its
  host resolves (DNS), which no schema can say: generated `webhook` fields and `?webhook=`
  parameters are left out (tests/it/webhooks.rs covers them, with a receiver).
"""
import base64
import json

import jsonschema_rs
import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    lines = value if isinstance(value, list) else [value]
    return "\n".join(json.dumps(line) for line in lines).encode()


_line_validators = {}


def _line_validator(operation, status):
    """The documented schema of one NDJSON line of `operation`'s answer with `status`."""
    key = (operation.method, operation.path, status)
    if key not in _line_validators:
        document = operation.schema.raw_schema
        responses = operation.definition.raw.get("responses", {})
        content = responses.get(str(status), {}).get("content", {})
        schema = content.get("application/x-ndjson", {}).get("schema")
        _line_validators[key] = (
            None
            if schema is None
            else jsonschema_rs.validator_for(
                {**schema, "components": document.get("components", {})}
            )
        )
    return _line_validators[key]


@schemathesis.deserializer("application/x-ndjson")
def ndjson_lines(ctx, response):
    """Checks every line against the documented line schema; gives schemathesis the last one."""
    # Lines end at "\n" only: str.splitlines() would also split at U+0085, U+2028 and other
    # characters a JSON string may hold unescaped.
    text = response.content.decode("utf-8")
    lines = [json.loads(line) for line in text.split("\n") if line.strip()]
    if not lines:
        raise NotImplementedError("an empty NDJSON answer has no line to check")
    validator = _line_validator(ctx.operation, response.status_code)
    for number, line in enumerate(lines, 1):
        if validator is not None:
            errors = [str(e) for e in validator.iter_errors(line)]
            if errors:
                raise ValueError(f"line {number} does not match the documented line schema: {errors[0]}")
    return lines[-1]


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def _strings_are_unicode(value):
    """Lone surrogates are accepted by Python's parser but are not Unicode text."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, list):
        for item in value:
            _strings_are_unicode(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _strings_are_unicode(key)
            _strings_are_unicode(item)


def _is_json(text):
    """Strict JSON (RFC 8259), as the server's parser reads it."""
    try:
        _strings_are_unicode(json.loads(text, parse_constant=_reject_constant))
        return True
    except (ValueError, UnicodeEncodeError):
        return False


def _decodes(text):
    try:
        base64.b64decode(text, validate=True)
        return True
    except ValueError:
        return False


def _mend(request):
    if not isinstance(request, dict):
        return
    request.pop("webhook", None)
    results = request.get("toolResults")
    for result in results if isinstance(results, list) else []:
        # The generator sometimes draws a non-integral float for a wide integer range
        # (executionMs is an integer in the schema); send the integer it meant.
        if isinstance(result, dict):
            ms = result.get("executionMs")
            if isinstance(ms, float) and ms >= 0 and not ms.is_integer():
                result["executionMs"] = int(ms)
        if isinstance(result, dict) and isinstance(result.get("resultJson"), str):
            if not _is_json(result["resultJson"]):
                result["resultJson"] = "{}"
    artifacts = request.get("inputArtifacts")
    for artifact in artifacts if isinstance(artifacts, list) else []:
        if (
            isinstance(artifact, dict)
            and artifact.get("encoding") == "base64"
            and isinstance(artifact.get("contents"), str)
            and not _decodes(artifact["contents"])
        ):
            artifact["contents"] = base64.b64encode(artifact["contents"].encode()).decode()


@schemathesis.hook
def map_case(context, case):
    query = getattr(case, "query", None)
    if isinstance(query, dict):
        query.pop("webhook", None)
    body = getattr(case, "body", None)
    for item in body if isinstance(body, list) else [body]:
        _mend(item)
        if isinstance(item, dict):
            _mend(item.get("request"))
    return case
