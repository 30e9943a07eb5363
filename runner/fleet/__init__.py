"""A fleet run: one job per host of a spec with a list of hosts, rolled out at most `rollout.max_unavailable`
hosts down at a time (fleet), looking at a run, each host on its own (fleet_view), and an id that may name a run
or one job, resolved once for both front ends (targets).

May import: the primitives, state/, spec/, remote/, results/ and commands/. Not mcp/ (above it) nor cli/.
"""
