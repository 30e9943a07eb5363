"""TEST STAND-IN shaped like SGLang's launcher (not SGLang): it runs the server (its argv) and a child that
exits 3 on SIGTERM, as SGLang's detokenizer "crashed with exit code -15"; once the server has exited, the
launcher exits 1 when that child failed, as SGLang's own shutdown does. So under the default
KillMode=control-group a `systemctl stop` leaves the unit `failed`."""
import signal
import subprocess
import sys

CHILD = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(3)); time.sleep(1e6)"
child = subprocess.Popen([sys.executable, "-c", CHILD])
server = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop's SIGTERM: its children decide how it ends
server.wait()
sys.exit(1 if child.wait() else 0)
