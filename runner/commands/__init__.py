"""What each command does, as plain functions returning plain data or raising from the one error tree: one
job's submit, status, tail, cancel, results (controller; a submit's plan and outcomes in plan),
restore-service and gc, which name a host (upkeep), and the CI- and agent-facing commands: results by id, the
gate, history, wait (unattended).

May import: the primitives, state/, spec/, remote/ and results/. Nothing here prints or exits.
"""
