"""A fleet run: one job per host of a spec with a list of hosts, rolled out at most `rollout.max_unavailable`
hosts down at a time (fleet), and looking at a run, each host on its own (fleet_view).

May import: the primitives, state/, spec/, remote/, results/ and commands/. Not mcp/ (beside it) nor cli/.
"""
