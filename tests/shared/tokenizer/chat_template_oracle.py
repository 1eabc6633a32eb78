#!/usr/bin/python3
"""Renders chat templates with Debian's python3-jinja2 in the environment
transformers' apply_chat_template uses (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols; raise_exception, strftime_now and
transformers' tojson), as the oracle of chat_template_test.cc.

  chat_template_oracle.py TEMPLATE_FILE CASES_JSON NOW_EPOCH_SECONDS

CASES_JSON is a JSON list of variable objects. Prints a JSON list with one
{"ok": true, "text": ...} or {"ok": false, "error": ...} per case.
strftime_now formats NOW_EPOCH_SECONDS (local time) so outputs are fixed.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def main():
    template_file, cases_file, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(template_file, encoding="utf-8") as f:
        source = f.read()
    with open(cases_file, encoding="utf-8") as f:
        cases = json.load(f)

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)
    results = []
    for variables in cases:
        try:
            results.append({"ok": True, "text": template.render(**variables)})
        except TemplateError as e:
            results.append({"ok": False, "error": str(e)})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
