"""Files uploaded to the host (content-addressed). supervisor.py is stdlib-only; the pure estimators here
are imported by the controller, so nothing in this package may import torch at module level."""
