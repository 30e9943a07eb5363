"""The host side: the supervisor and its rooms (stdlib only), uploaded as one content-addressed bundle, and
payloads/ (benchmarks and the demo), each uploaded apart, per job, with its own import closure."""
