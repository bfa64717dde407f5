"""Experiments without a clock, each replaying a workload's requests through kvplan/memory/.

capacity: the lesson's capacity experiment (every request at its final length, admitted greedily)
  and its block-size sweep.
prefix: automatic prefix caching replayed in arrival order (hit rates by vLLM's definitions).
sharing: parallel sampling and beam search by fork and copy-on-write.
documents: the prefix and sharing experiments of a workload: their sections, runs and JSON.
"""
