"""Runs and what they show: the suite's run definitions, running or reusing runs, readers and tables, the report
and the notebook runner. The top layer: nothing else in the package imports it."""
