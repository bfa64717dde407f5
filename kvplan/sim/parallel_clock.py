"""The MoE time the DP ranks of a MoE model share in a step, and the mean-field clock of one rank.

`shared_moe_ticks`: one global step's routed experts and all-to-all, in ticks, from the tokens
each DP rank runs (kvplan/model/parallel_step.py's ParallelStep.experts_s at group_tokens = their
sum: the busiest rank's experts over everyone's tokens; all_to_all_s: allgather_reducescatter
gathers all N tokens on every rank, priced at N / D a rank; the DeepEP backends send each rank's
own, the busiest sender's the most). kvplan/sim/data_parallel.py adds it to every rank's step.

`draft_moe_ticks`: an MTP drafter's own MoE layers in the same step, pass by pass: each draft pass
runs the model's MTP layer(s), each with routed experts split like the target's, so its experts and
all-to-all are shared by the ranks like the target's layers (a rank without drafts in the pass runs
a dummy token, as for the target).

`mean_field_clock`: one rank's clock as if every rank ran the same n tokens: its linear table
gains shared_moe_ticks([n] x D) at each n. One rank's engine on 1 / D of the traffic with this
clock (data_parallel.mean_field) would let a search use the fast engine; what it leaves out (the
ranks' different batches, the slowest rank setting every step, dummy batches) is measured against
the lockstep reference by bench/dp_mean_field.py: a median error of 19% over TTFT and TPOT p50 /
p99 on five workloads, up to -76%, nearly always optimistic. So nothing reachable from the CLI
uses it: `kvplan plan` runs the lockstep reference for its DP configurations.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.sim.timing import TICKS_PER_SECOND, StepClock


def shared_moe_ticks(step, tokens: list[int]) -> int:
    """Ticks of the routed experts and the all-to-all of one global step, each rank's `tokens`
    (`step`: the run's ParallelStep; 0 without one or without tokens)."""
    if step is None or not tokens or max(tokens) <= 0:
        return 0
    _, _, model, _, f_moe = step.stages[0]
    return int(round(_moe_s(step, tokens, f_moe, model.moe_layers) * TICKS_PER_SECOND))


def _moe_s(step, tokens: list[int], f_moe: float, layers: int) -> float:
    """Seconds of `layers` MoE layers (a share `f_moe` of the model's experts) over each rank's
    `tokens`: the busiest rank's experts over everyone's tokens, and the all-to-all (allgather
    gathers all N tokens, priced at N / D a rank; DeepEP the busiest sender's)."""
    group = sum(tokens)
    sent = -(-group // len(tokens)) if step.backend == "allgather_reducescatter" else max(tokens)
    return step.experts_s(max(tokens), f_moe, group_tokens=group) + step.all_to_all_s(sent, layers)


def draft_moe_ticks(step, passes: list[list[int]], layers: int) -> int:
    """Ticks of the routed experts and all-to-all of an MTP drafter's MoE layers over its passes in
    one global step (`passes`: per draft pass, each rank's tokens; `layers`: the draft's MoE
    layers, num_nextn_predict_layers): each pass runs `layers` of the target's MoE layers on the
    tokens of every rank together, priced as shared_moe_ticks prices one of the target's (its
    share 1 / the target's MoE layers of experts_s, and all_to_all_s of one layer)."""
    if step is None or layers <= 0:
        return 0
    _, _, model, _, f_moe = step.stages[0]
    if model.moe_layers <= 0 or f_moe == 0:
        return 0
    one = f_moe / model.moe_layers
    total = sum(layers * _moe_s(step, tokens, one, 1) for tokens in passes if tokens and max(tokens) > 0)
    return int(round(total * TICKS_PER_SECOND))


def mean_field_clock(clock: StepClock, step, dp: int) -> StepClock:
    """`clock` with the MoE time of D ranks of n tokens each added to its linear table (n = 0 and
    beyond the table: the table's last slope, as StepClock extends it)."""
    if not clock.timed or not clock.physical or step is None:
        return clock
    linear = tuple(x + shared_moe_ticks(step, [n] * dp) for n, x in enumerate(clock.linear))
    slope = max(linear[-1] - linear[-2], 0) if len(linear) > 1 else clock.linear_slope
    return replace(clock, linear=linear, linear_slope=slope)
