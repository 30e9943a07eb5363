"""runner: detached remote benchmark jobs over SSH that stop a GPU service, run, and always bring it back."""

__version__ = "0.1.0"
