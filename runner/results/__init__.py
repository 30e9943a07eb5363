"""Results: a result.json read and rendered as a table or a plot (results), a fleet's hosts side by side
(fleet_results), the regression gate and its reports (gate, gate_report), the GPU clocks a result was
measured at (clocks), and the local history with its tables and plots (history, history_report).

Pure functions of parsed JSON, plus the history's SQLite file; matplotlib only when plotting. May import: the
primitives, state/, and remote_payload's sweep labels.
"""
