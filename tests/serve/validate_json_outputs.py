#!/usr/bin/env python3
"""Validates structured-output samples with an independent JSON Schema validator.

Usage: validate_json_outputs.py FILE, where FILE holds
  [{"name": ..., "schema": {...}, "outputs": ["<text>", ...]}, ...]
Each text must parse as JSON and validate against its schema (Draft 2020-12, formats
checked). Prints one line per failure and a summary; exits 1 on any failure.
"""
import json
import sys

import jsonschema


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    checker = jsonschema.FormatChecker()
    failures = total = 0
    for case in cases:
        validator = jsonschema.Draft202012Validator(case["schema"], format_checker=checker)
        for text in case["outputs"]:
            total += 1
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                failures += 1
                print(f"{case['name']}: not JSON ({e}): {text!r}")
                continue
            errors = list(validator.iter_errors(value))
            if errors:
                failures += 1
                print(f"{case['name']}: {errors[0].message} at {list(errors[0].path)}: {text!r}")
    print(f"validated {total} outputs, {failures} failed (jsonschema {jsonschema.__name__})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
