"""The cell and table formats every generated docs table shares (scripts/make_docs_tables.py)."""
import math


def x(v, digits=2):
    return f"{v:.{digits}f}x"


def num(v, fmt="{:,.0f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
