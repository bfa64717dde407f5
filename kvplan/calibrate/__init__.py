"""Calibrating the step-time model on measured runs: the shared fit (`fit.py`), the timing profile
it writes (kvplan/model/timing_profile.py reads it), and a user's own `vllm bench serve` results
(`bench_files.py`)."""
