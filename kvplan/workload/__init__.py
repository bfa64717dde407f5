"""What is served and what arrives: workload files, their schema, distributions and trace readers.

yaml_nodes: YAML read safely, every value with its file and line, and typed getters that fail
  with a located one-line error.
records: the plain records every consumer shares (Workload, RequestChunk, the pool, scheduler and
  timing settings, allocator specs).
schema: the workload file's keys and their validation, into a Workload.
distributions: prompt and output length distributions and arrival processes, drawn in chunks.
traces/: streamed readers of public request traces (Azure, Mooncake, Vidur, ShareGPT, agentic).

The serving engine (kvplan/sim/), the replays (kvplan/replay/) and the commands all read
workloads from here; nothing here runs a simulation.
"""
