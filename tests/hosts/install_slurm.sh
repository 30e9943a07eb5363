#!/usr/bin/env bash
# install_slurm.sh -- the Debian packages the real Slurm test cluster (tests/hosts/slurm_cluster.py) needs.
# Idempotent: installs only what is missing, runs `apt-get update` once and only then. Installing starts no
# daemon where policy-rc.d forbids it (containers); the fixture starts its own in a temp dir either way.
#   munge         munged + mungekey (auth between the daemons and the clients)
#   slurmctld     the controller;  slurmd: the node daemon;  slurm-client: sbatch squeue sacct scancel sinfo
#   slurmdbd      accounting daemon, so `sacct --json` gives real final states (as on a production cluster)
#   mariadb-server  slurmdbd's database (mariadbd, mariadb-install-db and the mariadb client)
set -euo pipefail
packages=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
needed=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || needed+=("$pkg")
done
((${#needed[@]})) || exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${needed[@]}"
