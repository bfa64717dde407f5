"""Human output of `kvplan validate`: predicted vs allocated vs CUDA-measured bytes, attention errors.

Reads a kvplan.backends.torch ValidationResult by attribute; imports neither torch nor the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.report.output import console
from kvplan.text import terminal
from kvplan.units import format_bytes

if TYPE_CHECKING:
    from kvplan.backends.torch.validate import GroupCheck, ValidationResult

PATHS = (("reference", "gather+matmul"), ("sdpa", "gather+SDPA"), ("flex", "flex"))


def _n(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _group_name(g: GroupCheck) -> str:
    window = f", window {g.window:,}" if g.window else ""
    return f"{g.kind} x{g.num_layers}{window}"


def _shapes(g: GroupCheck) -> str:
    """'K, V (32, 16, 8, 128)' when K and V share a shape, else one role per line."""
    shapes = {role: tuple(shape) for role, shape in g.shapes.items()}
    if set(shapes) == {"k", "v"} and shapes["k"] == shapes["v"]:
        return f"K, V {shapes['k']}"
    return "\n".join(f"{'latent' if role == 'latent' else role.upper() if len(role) == 1 else role} {shape}"
                     for role, shape in shapes.items())


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[bold red]FAIL[/]"


def render_validation(result: ValidationResult) -> None:
    """Print the byte comparison and the attention check of one validation run."""
    r = result
    out = console()
    out.print(_bytes_table(r))
    state = f" + {r.layout_state_bytes:,} B state x {r.max_seqs} sequences" if r.layout_state_bytes else ""
    out.print(f"kvplan: {r.num_blocks:,} blocks x {r.block_size} tokens x {r.layout_bytes_per_token:,} B/token"
              f"{state} = {r.predicted_bytes:,} B ({format_bytes(r.predicted_bytes)})")
    if r.cuda_rounding_bytes:
        out.print(f"CUDA caching allocator rounding: {r.cuda_rounding_bytes:,} B beyond the tensors' bytes")
    out.print(_attention_table(r))
    lengths = ", ".join(str(n) for n in r.request_lengths)
    out.print(f"requests: {lengths} tokens, plus a fork of the first; {r.q_heads} query heads per GPU; "
              f"copy-on-write copies made: {r.cow_copies}")
    for note in r.notes:
        out.print(f"[dim]note: {terminal(note)}[/dim]")
    if r.ok:
        out.print("[bold green]PASS[/]: bytes agree to the byte; paged attention equals dense attention")
    else:
        out.print("[bold red]FAIL[/]: see the rows marked FAIL")


def _bytes_table(r: ValidationResult):
    from rich.table import Table

    cuda = r.cuda_measured_bytes is not None
    title = (f"KV pool of {terminal(r.model)}: {len(r.layer_kinds)} of {r.model_layers} layers, "
             f"KV {r.kv_dtype} stored as {r.storage_dtype}, on {r.device} (bytes)")
    table = Table(title=title, title_justify="left")
    table.add_column("group")
    table.add_column("tensor per layer")
    for col in ("kvplan predicted", "allocated", *(("CUDA measured", "rounding") if cuda else ()), "match"):
        table.add_column(col, justify="right")
    for g in r.groups:
        measured = (_n(g.cuda_measured_bytes), _n(g.cuda_rounding_bytes)) if cuda else ()
        table.add_row(_group_name(g), _shapes(g), _n(g.predicted_bytes), _n(g.allocated_bytes), *measured,
                      _mark(g.predicted_bytes == g.allocated_bytes))
    measured = (_n(r.cuda_measured_bytes), _n(r.cuda_rounding_bytes)) if cuda else ()
    table.add_section()
    table.add_row("[bold]total[/]", "", _n(r.predicted_bytes), _n(r.allocated_bytes), *measured,
                  _mark(r.predicted_bytes == r.allocated_bytes))
    return table


def _attention_table(r: ValidationResult):
    from rich.table import Table

    tolerances = {key: next((g.tolerances[key] for g in r.groups if g.kind != "state"), None) for key, _ in PATHS}
    table = Table(title=f"Paged vs dense float64 attention, max abs error (compute {r.compute_dtype})",
                  title_justify="left",
                  caption=f"tolerance: gather+matmul {tolerances['reference']:.0e} (fp32 math), "
                          f"SDPA and flex {tolerances['sdpa']:.0e}" if tolerances["reference"] else None,
                  caption_justify="left")
    table.add_column("group")
    table.add_column("read back", justify="right")
    for _, label in PATHS:
        table.add_column(label, justify="right")
    table.add_column("check", justify="right")
    for g in r.groups:
        errors = ["-" if g.errors.get(key) is None else f"{g.errors[key]:.1e}" for key, _ in PATHS]
        table.add_row(_group_name(g), "exact" if g.readback_exact else "[bold red]differs[/]", *errors, _mark(g.ok))
    return table
