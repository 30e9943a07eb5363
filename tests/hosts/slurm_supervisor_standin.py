"""TEST STAND-IN for remote_payload/supervisor.py in a Slurm allocation (its `slurm-run` is not built yet).

Records what the batch script from remote_payload/slurm/batch.py handed it: argv, cwd and the allocation's
GPU variables, as JSON in ./seen.json (cwd is the job dir), then exits with the code in $STANDIN_EXIT (0).
"""
import json
import os
import sys

KEYS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_GPUS_ON_NODE")
with open("seen.json", "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {key: os.environ.get(key) for key in KEYS}}, fh)
sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))
