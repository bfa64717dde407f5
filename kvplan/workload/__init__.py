"""What is served and what arrives: workload files, their schema, distributions and trace readers.

yaml_nodes: YAML read safely, every value with its file and line, and typed getters that fail
  with a located one-line error.
spec: the records a workload is declared in (WorkloadSpec and its sections, FleetSpec), checked
  when they are made; flag runs, plan configurations and fleet groups are `replace(...)` of them.
checks: the value checks the records share, worded as every reader words them.
routing: the registry of a fleet's routers (names, what each does) and RouterSpec.
schema: the YAML reader of a workload file, into a WorkloadSpec, located by line.
build: a WorkloadSpec into the Workload that runs (model resolved, pool sized, defaults filled).
spec_yaml: a spec written back as the file that reads to it (--show-workload).
records: the plain records every consumer shares (Workload, RequestChunk, the pool, scheduler and
  timing settings, allocator specs).
distributions: prompt and output length distributions and arrival processes, drawn in chunks.
traces/: streamed readers of public request traces (Azure, Mooncake, Vidur, ShareGPT, agentic).

The serving engine (kvplan/sim/), the replays (kvplan/replay/) and the commands all read
workloads from here; nothing here runs a simulation.
"""
