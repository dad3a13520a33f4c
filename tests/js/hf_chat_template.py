"""Renders a chat template exactly as Hugging Face transformers does (its
render_jinja_template: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loopcontrols extension, its tojson filter and its raise_exception and
strftime_now globals), for the reference tests. Debian's python3-jinja2; no transformers.

Usage: python3 hf_chat_template.py TOKENIZER_DIR REQUEST.json
REQUEST: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool?, other keys:
template variables}. Prints {"text": ...} or {"error": ...} as JSON on stdout.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def token(config, key):
    v = config.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v


def main():
    directory, request_path = sys.argv[1], sys.argv[2]
    config = json.load(open(f"{directory}/tokenizer_config.json", encoding="utf-8"))
    template = config["chat_template"]
    if isinstance(template, list):
        template = next(t["template"] for t in template if t["name"] == "default")
    request = json.load(open(request_path, encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    variables = {k: token(config, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    variables.update({
        "messages": request["messages"],
        "tools": request.get("tools"),
        "documents": None,
        "add_generation_prompt": request.get("add_generation_prompt", True),
    })
    variables.update({k: v for k, v in request.items()
                      if k not in ("messages", "tools", "add_generation_prompt")})
    try:
        text = env.from_string(template).render(**variables)
        print(json.dumps({"text": text}, ensure_ascii=False))
    except jinja2.exceptions.TemplateError as e:
        print(json.dumps({"error": str(e)}, ensure_ascii=False))


if __name__ == "__main__":
    main()
