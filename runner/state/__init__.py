"""The controller's own records in the state dir: the job index and log cursors (store), a fleet run's record
(fleet_store) and job ids (job_id).

Standard library only: a tail loads nothing heavier. May import: the primitives and remote_payload's contract.
"""
