#!/usr/bin/env python3
"""The host side's entry script: BOOT imports it and calls `main`; the detached processes run it by its path.

Uploaded, the package lives in ROOT/payload/<digest>/, a directory not named after it, so this script binds
its own directory as the package `remote_payload` and calls commands.main. First it takes its own directory
off sys.path: no module may be importable a second time as a top-level module (`contract` beside
`remote_payload.contract` would be two copies: two Fail classes, two sets of constants).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def bind_package() -> None:
    """`remote_payload` is this directory, unless it is imported already (the controller's tests)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    if "remote_payload" in sys.modules:
        return
    # What importlib.util.spec_from_file_location + module_from_spec would make, without loading importlib on
    # every host call: a package whose path is this directory. Its __init__ imports nothing.
    init = os.path.join(HERE, "__init__.py")
    package = type(sys)("remote_payload")
    package.__file__, package.__path__, package.__package__ = init, [HERE], "remote_payload"
    sys.modules["remote_payload"] = package
    with open(init, encoding="utf-8") as fh:
        exec(compile(fh.read(), init, "exec"), package.__dict__)


def main(argv=None) -> int:
    bind_package()
    from remote_payload.commands import main as run_command_line

    return run_command_line(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
