"""A sweep's variants: the cartesian product of `sweep.matrix` plus the `sweep.include` combinations.

Stdlib only, pure (no I/O). The controller expands the spec with it (runner/spec/spec.py) and sends the variants
on the wire; the host reads them as given (supervision/sweep.py) and never expands.
"""
from __future__ import annotations

import itertools
import math
import os
import shlex

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


def slot_problem(devices: list, per_variant) -> str | None:
    """Why `gpu.devices` cannot be cut into slots of `sweep.gpus_per_variant` devices (None: it can)."""
    if not isinstance(per_variant, int) or isinstance(per_variant, bool) or per_variant < 1:
        return "sweep.gpus_per_variant must be a whole number >= 1, got %r" % (per_variant,)
    if not devices:
        return "sweep.gpus_per_variant needs gpu.devices: the variants share them out, %d each" % per_variant
    if len(devices) % per_variant:
        return ("gpu.devices holds %d devices, not a multiple of sweep.gpus_per_variant (%d): every slot needs "
                "as many" % (len(devices), per_variant))
    return None


def slots(devices: list, per_variant=None) -> list:
    """The devices cut in order into slots of per_variant each; one slot of them all when per_variant is None."""
    if per_variant is None:
        return [list(devices)]
    return [list(devices[k:k + per_variant]) for k in range(0, len(devices), per_variant)]


def rounds(variants: int, slot_count: int) -> int:
    """How many variants one slot runs at most, one after another: the time bounds' factor."""
    return math.ceil(max(variants, 1) / max(slot_count, 1))


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash")


def fill(command: list, args: dict) -> list:
    """A command payload's argv for one variant: each literal `{KEY}` replaced by the variant's value; in the
    script of `sh -c SCRIPT` (any shell of SHELLS, `-c` alone or among other one-letter options) the value
    goes in shell-quoted, so it is data there too and never shell code (write `{KEY}` bare in the script, not
    inside quotes of its own: a plain value is left as it is, any other is quoted once)."""
    script = shell_script_index(command)
    filled = []
    for index, word in enumerate(command):
        for key, value in args.items():
            text = _text(value)
            word = word.replace("{%s}" % key, shlex.quote(text) if index == script else text)
        filled.append(word)
    return filled


def shell_script_index(command: list):
    """The index of the script word of `SHELL [-OPTS] -c SCRIPT …`, or None when the command is no shell's."""
    if not command or os.path.basename(command[0]) not in SHELLS:
        return None
    for index, word in enumerate(command[1:], 1):
        if not word.startswith("-") or word.startswith("--"):
            return None  # a script file: its arguments are argv, not shell code
        if "c" in word[1:]:
            return index + 1 if index + 1 < len(command) else None
    return None


def unused_keys(command: list, keys) -> list:
    """Sweep keys that no `{KEY}` of the command uses (an error: the variants would all run the same)."""
    return [key for key in keys if not any("{%s}" % key in word for word in command)]


def label(args: dict) -> str:
    """`experts=384 routing=zipf`: a variant's name in tables, logs and plot legends."""
    return " ".join("%s=%s" % (k, _text(v)) for k, v in args.items())


def job_variants(spec: dict) -> list:
    """What the host runs: a sweep's variants as the wire gives them, else the plain job as a list of one."""
    if spec.get("sweep"):
        return spec["sweep"]["variants"]
    payload = spec["payload"]
    argv = payload["command"] if payload["command"] is not None else payload["args"]
    return [{"args": {}, "argv": list(argv)}]
