"""The job spec: the pydantic models and their wire form (spec, spec_slurm, spec_fleet), the field rules
(spec_fields), reading a YAML file with `--set` overrides (spec_load), the JSON Schema and what each key is for
(spec_reference), and the payload's args check (payload_args).

Importing it costs pydantic and yaml: the commands import it where they validate, never at start-up. May
import: the primitives, state/, and remote_payload's shared modules (contract, sweep, slurm's rules).
"""
