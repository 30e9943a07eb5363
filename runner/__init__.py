"""runner: detached remote benchmark jobs over SSH that stop a GPU service, run, and always bring it back.

The controller in layers, lowest first; a module imports from its own folder, the primitives and the folders
below it, never from a folder beside it or above it (tests/lint/import_layers.py enforces it, cycles too):

    errors, deadline, printable, local_files   primitives: the error tree, the one deadline, safe text, bounded files
    state/                                     the controller's own records in the state dir
    spec/  remote/  results/                   the job spec; reaching a host; results, gate, history (side by side)
    commands/                                  what each command does, as plain functions
    fleet/                                     a run over several hosts; an id that may name one (targets)
    mcp/                                       the MCP server
    cli/                                       the command line
    __main__                                   `python -m runner`

The host side (remote_payload/) never imports this package; any layer here may import its shared,
stdlib-only modules (contract, admission, sweep, progress). No `__init__` imports anything: a command loads
only the modules it uses (tests/unit/test_command_imports.py).
"""

__version__ = "0.2.0"
