"""What the test modules share: job files, targets and checks for driving runner against the test hosts
(tests/hosts/ starts the hosts themselves; tests/conftest.py holds the shared fixtures). A test module imports
from here, never from another test module (tests/lint/import_layers.py checks it)."""
