"""Whether a serve run (or a fleet) was overloaded: requests arrived faster than it admitted them.

The test reads only the run's own records, per request in arrival order: its arrival and its
first admission (vLLM's scheduler is first come, first served, so a server that keeps up admits
the requests of a stretch of arrivals over a stretch of the same length, a little later; one that
does not admits them over a longer one, and the waiting queue grows). Two bands of requests are
compared, the 40-50% and the 90-100% of arrivals (the second half of the run, past its warm-up):

    offered   = requests between the bands' medians / the time between their median arrivals
    sustained = the same requests / the time between their median first admissions

The run is overloaded when sustained < SUSTAINED_SHARE x offered. Medians over bands of a tenth of
the run make the test robust to noise: a single slow request, a burst of a few arrivals or a long
prompt moves neither median, while a queue that grows moves the second band's admissions by the
whole backlog. A run with fewer than MIN_REQUESTS requests, or whose requests all arrived at once
(no arrival rate), has no verdict. Everything is computed from integer ticks in a fixed order, so
the verdict and its numbers are the same on every run of the same workload.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUSTAINED_SHARE = 0.9  # "clearly below": the server admits less than 90% of what arrives
MIN_REQUESTS = 40  # bands of at least 4 requests each
BANDS = ((0.4, 0.5), (0.9, 1.0))  # the share of the run's arrivals each band spans


@dataclass(frozen=True, slots=True)
class Overload:
    """The verdict, with its numbers in requests per time unit and queue delays in time units."""

    overloaded: bool
    offered_rate: float
    sustained_rate: float  # the offered rate when the server kept up
    queue_delay_mid: float  # median queue delay (first admission - arrival) of the 40-50% band
    queue_delay_end: float  # ... and of the last 10% of arrivals

    def to_dict(self) -> dict:
        return {"overloaded": self.overloaded, "offered_rate": self.offered_rate,
                "sustained_rate": self.sustained_rate, "queue_delay_mid": self.queue_delay_mid,
                "queue_delay_end": self.queue_delay_end}


def _band(n: int, lo: float, hi: float) -> slice:
    return slice(int(n * lo), max(int(n * hi), int(n * lo) + 1))


def overload_of(arrival: np.ndarray, admitted: np.ndarray, per_unit: int) -> Overload | None:
    """The verdict of a run whose requests, in arrival order, arrived and were first admitted at
    these ticks (`per_unit` ticks a time unit); None without one (see the module docstring)."""
    n = len(arrival)
    if n < MIN_REQUESTS or len(admitted) != n:
        return None
    mid, end = (_band(n, lo, hi) for lo, hi in BANDS)
    a_mid, a_end = float(np.median(arrival[mid])), float(np.median(arrival[end]))
    d_mid, d_end = float(np.median(admitted[mid])), float(np.median(admitted[end]))
    between = (mid.start + mid.stop - 1) / 2, (end.start + end.stop - 1) / 2
    count = between[1] - between[0]
    if a_end <= a_mid:  # all at once, or nearly: no rate was offered
        return None
    offered = count * per_unit / (a_end - a_mid)
    sustained = min(offered, count * per_unit / (d_end - d_mid)) if d_end > d_mid else offered
    delays = admitted - arrival
    return Overload(overloaded=sustained < SUSTAINED_SHARE * offered, offered_rate=offered,
                    sustained_rate=sustained, queue_delay_mid=float(np.median(delays[mid])) / per_unit,
                    queue_delay_end=float(np.median(delays[end])) / per_unit)
