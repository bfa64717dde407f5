"""`kvplan check`: check files of named size/simulate runs with assertions and baselines.

records: the plain records (checks, expectations, outcomes, tracked metrics).
file: reading and validating a check file.
expr: the assertion expressions (`ttft_s.p99 <= 2.0`).
lookup: selecting a result entry and reading a metric path from a run's JSON document.
baseline: stored baselines, tolerances and the comparison.
run: running the checks into a report.
"""
