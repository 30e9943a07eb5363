"""Where the supervisor's bundle lies and how a detached process re-executes it: HERE is the bundle's root (the package
remote_payload; ROOT/payload/<digest>/ on a host), where supervisor.py and the payload scripts are; RUN_SUPERVISOR is
the argv every detached process of the supervisor starts with. Imports only the stdlib.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPERVISOR = os.path.join(HERE, "supervisor.py")  # the entry point every detached process re-executes
# ... with this interpreter and its -S (the launch line's: stdlib only, no site-packages' .pth files to run)
RUN_SUPERVISOR = [sys.executable] + (["-S"] if sys.flags.no_site else []) + [SUPERVISOR]
