"""Real test hosts: a loopback sshd, a confined systemd service host, and network-namespace hosts.

Only nvidia-smi is faked (tests/hosts/bin/nvidia-smi, labelled as a stand-in): these machines have no GPU.
"""
