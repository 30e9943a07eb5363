"""A sweep's variants: the cartesian product of `sweep.matrix` plus the `sweep.include` combinations.

Stdlib only, pure (no I/O). The controller expands the spec with it (runner/spec.py) and sends the variants
on the wire; the host reads them as given (supervisor_sweep.py) and never expands.
"""
from __future__ import annotations

import itertools

MAX_VARIANTS = 1000  # over it the spec is refused (exit 2 naming `sweep`)


def expand(matrix: dict, include: list) -> list:
    """[{KEY: value, …}, …]: every combination of the matrix's axes (in their order), then each `include`
    entry not already produced. An empty matrix with includes gives just the includes."""
    keys = list(matrix)
    variants = [dict(zip(keys, values)) for values in itertools.product(*(matrix[k] for k in keys))] if keys else []
    for extra in include:
        if dict(extra) not in variants:
            variants.append(dict(extra))
    return variants


def count(matrix: dict, include: list) -> int:
    """How many variants `expand` would give at most, without building them (the cap is checked first)."""
    product = 1
    for values in matrix.values():
        product *= len(values)
    return (product if matrix else 0) + len(include)


def label(args: dict) -> str:
    """`experts=384 routing=zipf`: a variant's name in tables, logs and plot legends."""
    return " ".join("%s=%s" % (k, ",".join(map(str, v)) if isinstance(v, list) else v) for k, v in args.items())
