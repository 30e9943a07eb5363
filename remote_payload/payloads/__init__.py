"""Payload packages: one folder per payload, its script plus the modules it imports. A job uploads only its
script's local import closure (runner/remote/import_closure.py), never the supervisor's files nor another payload's;
a bare `payload.script: NAME.py` names the one package here that holds NAME.py."""
