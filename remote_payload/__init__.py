"""The host side of runner: stdlib only, Python >= 3.8, never importing `runner` (docs/design.md has the tree).

All of it but payloads/ is uploaded as one content-addressed bundle; payloads/ are uploaded apart, per job, each
with its own import closure. No imports here."""
