"""Reaching a host: the transports (transport: paramiko and local; transport_openssh: the user's ssh), the host
client with one method per supervisor subcommand (host), every answer checked against the wire contract
(answers; the typed answers of status, submit and result in job_answers), and the host's submit-time verdict
raised as errors (preflight).

May import: the primitives, state/ (where the ssh control sockets, ssh -G's answers and the supervisor's digest
live), and remote_payload's contract and admission. Nothing here knows the spec's models: a host is addressed by
plain data.
"""
