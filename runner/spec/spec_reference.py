"""The job spec's reference: the JSON Schema (`runner schema`, for editors; tests/lint/spec_reference.py writes
docs/spec-reference.md from it), generated from the pydantic models. Types, defaults and allowed values come
from the models; the one thing written here is what each key is for (DESCRIPTIONS). A key without a description
fails tests/unit/test_spec_reference.py, so the reference cannot fall behind the schema.
"""
from __future__ import annotations

from collections.abc import Iterator

from .spec import JobSpec

SCHEMA_ID = "https://runner.invalid/job-spec.schema.json"

DESCRIPTIONS = {
    "name": "What the job measures; becomes part of the job id.",
    "host": "Where the job runs.",
    "host.address": "An ssh_config alias (its HostName, User, Port, IdentityFile, ProxyJump apply), a host name, "
                    "an IP address, or `local` (this machine, no SSH). A list of them is a fleet: one run, one job per "
                    "host (the rest of host, service, gpu apply to each), rolled out as `rollout` says.",
    "host.user": "Login user; overrides the alias's User (like `ssh -l`).",
    "host.port": "SSH port; overrides the alias's Port (like `ssh -p`).",
    "host.host_key_policy": "`strict`: the host key must already be in known_hosts. `accept-new`: record an "
                            "unknown key once (a changed key is still refused).",
    "host.root": "The supervisor's directory on the host (payload copies, job dirs, locks). Must be owned by the "
                 "login user and not writable by others.",
    "host.python": "Python 3 on the host that runs the stdlib-only supervisor (not the benchmark's).",
    "host.connect_timeout": "How long to wait for the SSH connection.",
    "host.transport": "How to reach the host: `openssh` runs your `ssh` with your ~/.ssh/config (certificates, "
                      "agents, Match, ProxyJump; one ControlMaster per host), `paramiko` the embedded client "
                      "(no `ssh` binary needed; no host certificates); `auto` is `openssh` when `ssh` is on PATH.",
    "service": "The inference service that may have to give up the GPU, and how to bring it back.",
    "service.manager": "`systemd` to manage `unit`; `none` when nothing has to be stopped.",
    "service.unit": "The systemd unit (NAME means NAME.service).",
    "service.scope": "`system` units, or the login user's own manager (`systemctl --user`).",
    "service.stop": "`if-needed`: stop only when the GPUs lack `gpu.min_free_mib`; `always`; `never` (then a "
                    "short GPU is a preflight refusal, exit 4).",
    "service.health_url": "http(s) URL answering 2xx once the service is ready again; without it the unit must "
                          "stay active for 2 s.",
    "service.health_timeout": "How long the restore waits for healthy.",
    "service.sudo": "Run systemctl/systemd-run through `sudo -n` (a NOPASSWD rule is needed: docs/guide.md, What the remote host needs).",
    "service.free": "How the GPU is freed: `stop` the unit (and start it after); `sglang` (0.5.17-0.5.23): pause "
                    "generation (`pause_mode`), release the KV cache (and the weights only if still short, and only "
                    "with SGLang's --enable-weights-cpu-backup), resume after (needs --enable-memory-saver); `vllm` "
                    "(0.12-0.34): sleep level 1 once the requests in flight have finished, wake after (needs "
                    "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1). The release is chosen by the version the "
                    "engine reports (docs/engines.md); another version is refused in preflight (exit 4). The unit "
                    "keeps running; it is restarted only when the API does not bring the engine back.",
    "service.api_url": "The engine's HTTP root for `free: sglang`/`vllm` (default: the origin of `health_url`).",
    "service.api_key": "Where the engine's API key lives ON THE HOST, never the key: `file:/PATH` (a file the host "
                       "login can read) or `env:NAME` (a variable of the unit's Environment= or EnvironmentFile=). "
                       "Sent as `Authorization: Bearer` on every engine call (SGLang's --api-key); read by each call, "
                       "written nowhere. A 401/403 is a preflight refusal (exit 4) naming this field.",
    "service.admin_api_key": "As `api_key`, for SGLang's --admin-api-key: its admin routes (pause, release, resume, "
                             "flush) then want this key, its reads still `api_key`'s.",
    "service.pause_mode": "How `free: sglang` holds its clients' requests (null: the release's default). `retract` "
                          "(SGLang 0.5.21+, its default): the requests in flight go back to SGLang's queue, their KV "
                          "cache freed, and with every arrival are held until the resume, then complete: none is "
                          "aborted, busy or not (runner confirms the running batch is empty before it releases). "
                          "`drain` (0.5.17-0.5.20's default): nothing is aborted; SGLang serves on until its "
                          "scheduler is idle, then an in-place pause holds new requests until the resume; past "
                          "`drain_timeout` nothing is released and the job ends FAILED, the service untouched "
                          "(unless `drain_fallback: abort`). `abort`: SGLang's abort pause at once: the requests in "
                          "flight come back aborted (HTTP 200, finish_reason abort, the tokens so far). `retract` on "
                          "0.5.17-0.5.20 is refused in preflight (exit 4): their release asserts that nothing waits "
                          "either, so it would kill the server. `limits.max_downtime` bounds how long clients are held.",
    "service.drain_timeout": "`free: sglang` with the default drain: how long to wait for SGLang's requests in "
                             "flight to finish before the release (at most 300 s; null: 60 s). Past it nothing is "
                             "released: the job ends FAILED, the service serving as before.",
    "service.drain_fallback": "`free: sglang` with the default drain: what to do when SGLang is still not idle after "
                              "`drain_timeout` (a load that never lets it idle). `skip` (null: the default): nothing "
                              "is released or aborted, the job ends FAILED, the service serving as before. `abort`: "
                              "SGLang's abort pause then: the requests still in flight come back aborted (counted in "
                              "the window's `clients`), and the job runs.",
    "service.gpus": "The GPUs this service holds (indexes or UUIDs), as the spec declares them (runner does not "
                    "discover them); a job frees the service only when its `gpu.devices` meet these. None listed: "
                    "every GPU of the host.",
    "services": "Several services on the host, each a `service` section with its own `gpus` (instead of "
                "`service`): a job frees only those its GPUs meet; the others keep serving and are never touched.",
    "gpu": "The GPUs the payload uses and the memory it needs.",
    "gpu.devices": "GPU indexes (nvidia-smi order) or UUIDs; the payload gets CUDA_VISIBLE_DEVICES for them. None "
                   "listed with a service means every GPU: the job takes every GPU's lock.",
    "gpu.min_free_mib": "Free memory needed on each device, in MiB (at most 16777216, 16 TiB), or `auto`: the "
                        "script's own `estimate_peak_bytes(args)` (given what its `parse_args` returned), asked on "
                        "the controller; a sweep's largest variant decides.",
    "gpu.drain_timeout": "How long to wait, after stopping the service, for the memory to be free.",
    "payload": "What runs: a script (a packaged payload or your own) with `args`, or a `command`.",
    "payload.python": "Interpreter that runs `script` on the host (e.g. the venv that has torch and sglang).",
    "payload.script": "A bare name of a packaged payload (the folder of remote_payload/payloads/ that holds it: "
                      "`bench_marlin_moe.py`, `demo_payload.py`), else a path relative to the job file. Uploaded "
                      "with its local import closure (the modules it imports from its own directory; not the "
                      "stdlib, not installed packages).",
    "payload.args": "The script's arguments: `key: value` becomes `--key value`, `true` a bare flag, a list "
                    "`1,2,3`. Checked against the script's own parser before anything is sent to the host.",
    "payload.env": "Extra environment for the payload (RUNNER_* are reserved).",
    "payload.files": "Data files that travel with `script` (configs, small weights): globs relative to the job "
                     "file (`data/*.json`, `weights/**`), each file inside the script's folder; on the host they "
                     "lie beside the script as here (open them relative to `__file__`). Content-addressed with "
                     "the script's bundle (an unchanged file is not sent again); `--dry-run` shows the bundle's "
                     "size; at most 1 GiB in all, and a glob that matches no file is refused (exit 2).",
    "payload.command": "An argv list run as is (instead of `script`).",
    "payload.prepare_args": "A prepare step run BEFORE the service is stopped: the script again with these args "
                            "merged over `args` (e.g. `prepare_only: true` to JIT-compile with no GPU memory).",
    "payload.prepare_command": "The prepare step of a `command` payload: an argv list.",
    "payload.staged": "Start the payload BEFORE the service is touched (after the prepare step), with "
                      "RUNNER_STAGED=1: it does its GPU-free setup (imports, backend load), prints the line "
                      "`{\"event\": \"staged\"}`, and waits for `go` on stdin, written once the GPU is free; "
                      "EOF instead means exit without touching the GPU. Dying or `limits.stage_timeout` while "
                      "staged ends the job with the service never stopped. Not with a sweep.",
    "payload.user": "Run the payload (and its prepare step) as this unprivileged host user; the supervisor and "
                    "its guard stay root. Its output and its result file (RUNNER_RESULT) are all it may write: the "
                    "job's records stay root's (docs/protocol.md, \"Threat model\"). Needs the supervisor to log "
                    "in as root and `host.root` reachable by the user; refused (exit 4) otherwise.",
    "launcher": "`ssh` (default): the supervisor runs on `host`. `slurm`: `host` is the login node and the job "
                "goes through sbatch (service.manager none, no gpu.devices; see docs/guide.md, Running on Slurm).",
    "slurm": "With launcher slurm: partition, gres or gpus, time (default: the prepare step and staging + "
             "max_runtime + grace + 60 s), account, qos, constraint, extra_args (each `--name=value`).",
    "rollout": "With a list of hosts: how the run's jobs are rolled out over them.",
    "rollout.max_unavailable": "At most this many hosts have their service stopped by the run at a time (a job "
                               "that leaves its service running does not count).",
    "rollout.stop_on_failure": "After a host fails (skipped, or its job ended other than SUCCEEDED), start no "
                               "more hosts.",
    "rollout.forks": "At most this many host calls (preflight, start, status) in flight at once, in list order, "
                     "like Ansible's forks; `runner submit --forks N` for one run. Waiting for a turn or for a "
                     "job's end holds none.",
    "slurm.partition": "The partition (sbatch --partition); a Slurm name ([A-Za-z0-9._-]).",
    "slurm.gres": "GPUs as generic resources, e.g. `gpu:2` or `gpu:a100:2` (sbatch --gres); or give `gpus`.",
    "slurm.gpus": "GPUs as a count (`2`) or TYPE:COUNT (`a100:2`) (sbatch --gpus); or give `gres`.",
    "slurm.time": "The allocation's time limit; default and minimum: limits.prepare_timeout (with a prepare step) "
                  "+ limits.stage_timeout (staged) + limits.max_runtime + grace + 60 s, in whole minutes (shorter "
                  "would let Slurm kill the job before its own deadline).",
    "slurm.account": "The account to charge (sbatch --account).",
    "slurm.qos": "The quality of service (sbatch --qos).",
    "slurm.constraint": "A node feature expression (sbatch --constraint), e.g. `h200&ib`.",
    "slurm.extra_args": "More sbatch options, one `--name=value` per item; not the ones the fields above set.",
    "sweep.matrix": "KEY: [values]: every combination of the axes is one variant.",
    "sweep.include": "Extra variants, each a {KEY: value} mapping, after the matrix's.",
    "sweep.fail_fast": "After a failing variant start no more (each one left is recorded \"not started\" with "
                       "the reason).",
    "sweep.max_parallel": "With launcher slurm: at most this many variants at once (the job array's `%k`); "
                          "default all. Refused with launcher ssh (there: `gpus_per_variant`).",
    "sweep.gpus_per_variant": "With launcher ssh: the variants side by side in one window, gpu.devices cut in "
                              "order into slots of this many, each variant on its own slot (CUDA_VISIBLE_DEVICES, "
                              "RUNNER_GPU_SLOT); a slot takes the next variant when its own ends. gpu.devices "
                              "must hold a multiple of it. Default: one after another, each with all devices.",
    "metrics": "Which columns of the result's `rows` the regression gate (`runner results --baseline`, "
               "`--save-baseline`, `--compare`) and the history compare, e.g. `{key: batch, lower: [us_per_call], "
               "higher: [tokens_per_s]}`: one metric per column and row, named COLUMN_KEY (`us_per_call_16`); a "
               "`rep_COLUMN` list in a row gives its measured spread. Not given: the result's own `metrics` "
               "object of the same form, else `median_us` by `m` or `size`.",
    "metrics.key": "The column that names a row (a batch size, or a short name).",
    "metrics.lower": "Columns where lower is better (a time).",
    "metrics.higher": "Columns where higher is better (a rate).",
    "limits": "Time limits.",
    "limits.max_runtime": "The payload's deadline: TERM, `grace`, then KILL of its process group.",
    "limits.grace": "Seconds between TERM and KILL.",
    "limits.queue_timeout": "With `submit --queue`: the longest wait for the service/GPU locks; past it the job ends TIMED_OUT with nothing stopped.",
    "limits.prepare_timeout": "The prepare step's deadline (the service is not stopped if it fails).",
    "limits.stage_timeout": "With `payload.staged`: the longest wait for the staged line; past it the job ends "
                            "TIMED_OUT with the service untouched. `max_runtime` counts from the hand-over.",
    "limits.max_downtime": "The window, from the first stop (or the run's start when nothing is stopped): every "
                           "payload ends by its end (a plain job still running is stopped: TIMED_OUT). A sweep's "
                           "first variants start whenever any of it is left; a later one only if the longest "
                           "variant so far fits in what is left, else it is recorded SKIPPED. Refused with "
                           "launcher slurm (no service window there).",
    "sweep": "Many variants in one downtime window (one stop, one restore): `matrix` (KEY: [values], the "
             "cartesian product), `include` (extra {KEY: value} combinations), `fail_fast` (stop after a failing "
             "variant). A script's variant keys override `payload.args`; in a `command`, `{KEY}` is replaced by "
             "the variant's value, shell-quoted in the script of `sh -c SCRIPT` (write `{KEY}` bare there) (a key "
             "used nowhere is refused). At most 1000 variants. With launcher slurm the "
             "sweep is one job array, one task (allocation) per variant, `max_parallel` (default: all) at once.",
}


def json_schema() -> dict:
    """The models' JSON Schema with every key's description, for editors (`# yaml-language-server: $schema=`)."""
    schema = JobSpec.model_json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
    for path, section in sections(schema):
        for key, prop in section["properties"].items():
            description = DESCRIPTIONS.get(f"{path}.{key}" if path else key)
            if description:
                prop["description"] = description
    return schema


def sections(schema: dict, path: str = "", section: dict | None = None) -> Iterator[tuple[str, dict]]:
    """(path, section schema) of the top level and of every section model below it, optional ones
    (`rollout: RolloutSpec | None`) too, depth first in the models' order."""
    section = schema if section is None else section
    yield path, section
    for key, prop in section["properties"].items():
        ref = _ref(prop)
        if ref:
            yield from sections(schema, f"{path}.{key}" if path else key, schema["$defs"][ref.rsplit("/", 1)[1]])


def _ref(prop: dict) -> str | None:
    """The section model a property refers to: directly, through allOf, or as the non-null side of anyOf."""
    candidates = [prop, *prop.get("allOf", []), *prop.get("anyOf", [])]
    return next((c["$ref"] for c in candidates if "$ref" in c), None)
