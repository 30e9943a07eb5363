"""Where the supervisor's bundle lies (HERE: ROOT/payload/<digest>/ on a host) and the argv every detached process
of the supervisor starts with (RUN_SUPERVISOR)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPERVISOR = os.path.join(HERE, "supervisor.py")  # the entry point every detached process re-executes
# ... with this interpreter and its -S (the launch line's: stdlib only, no site-packages' .pth files to run)
RUN_SUPERVISOR = [sys.executable] + (["-S"] if sys.flags.no_site else []) + [SUPERVISOR]
