"""Family rules for reading a config: which layers keep what, where a family departs from the
generic attention fields that kvplan/model/config.py reads.

- attention.py: DeepSeek's multi-head latent attention (MLA) and Nemotron-NAS (DeciLM) per-layer
  block configs;
- mamba.py: the Mamba2 mixer's shape (Mamba2Shape, mamba2_shape) and the hybrids that use Mamba:
  Nemotron-H, Falcon-H1, Granite 4.0 (Mamba2) and Jamba (Mamba1);
- linear_attention.py: MiniMax's lightning attention and Qwen3-Next's gated DeltaNet.

Each module imports only kvplan.errors, kvplan.model.spec and kvplan.model.config_reader (and
linear_attention / mamba nothing of each other); kvplan/model/config.py chooses among them.
"""
