"""The controller's own records in the state dir: the job index and log cursors (store), a fleet run's record
(fleet_store) and job ids (job_id).

Standard library only, so a warm submit and a tail load nothing heavier. May import: the primitives
(runner.errors, …) and remote_payload's contract.
"""
