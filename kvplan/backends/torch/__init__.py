"""Real KV tensors that check kvplan's numbers: paged pools, paged attention, memory validation.

Optional: needs torch (`pip install 'kvplan[torch]'`). Importing this package without torch raises
TorchNotInstalled, a KvplanError, so the CLI prints one line and exits 2 instead of a traceback.
Nothing outside this package imports torch.
"""

from __future__ import annotations

from kvplan.errors import KvplanError


class TorchNotInstalled(KvplanError):
    """The torch backend was asked for but torch cannot be imported."""


try:
    import torch  # noqa: F401
except ImportError:
    raise TorchNotInstalled("torch is not installed; pip install 'kvplan[torch]'") from None

__all__ = ["GroupCheck", "TorchNotInstalled", "ValidationResult", "run_validation"]


def __getattr__(name: str):
    """run_validation and its records, imported on first use."""
    if name in ("GroupCheck", "ValidationResult", "run_validation"):
        from kvplan.backends.torch import validate

        return getattr(validate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
