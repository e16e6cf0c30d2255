"""What a label comes with: the warnings that make a run's numbers less trustworthy
(a partial run, a client that did not keep up, errors, scrapes of more than one server,
Little's law not holding)."""

from __future__ import annotations

from filledfirst.analysis.diagnosis.features import Features
from filledfirst.analysis.numbers import share
from filledfirst.study import DiagnosisRules


def warnings(f: Features, t: DiagnosisRules) -> list[str]:
    out = []
    if f.status == "partial" or f.n_not_sent:
        unsent = f.n_not_sent
        out.append("partial run" + (f" ({unsent} of {f.n_requests} requests never sent)" if unsent else ""))
    lag, failed = f.lag_p99_ms, f.failed_share
    if lag is not None and lag > t.max_lag_ms:
        out.append(f"client-limited (dispatch lag p99 {lag:.0f} ms > {t.max_lag_ms:g} ms)")
    cpu, arrivals = f.client_cpu_share, f.arrival_ratio
    if cpu is not None and cpu >= t.max_client_cpu_share:
        out.append(f"client-limited (its busiest process used {share(cpu)} of a core over the replay, >= "
                   f"{share(t.max_client_cpu_share)})")
    if arrivals is not None and arrivals < t.min_arrival_ratio:
        out.append(f"client-limited (sent {share(arrivals)} of the scheduled arrival rate, needs >= "
                   f"{share(t.min_arrival_ratio)})")
    if failed is not None and failed > t.max_failed_share:
        out.append(f"errors ({share(failed)} of sent requests failed)")
    if f.counter_drops:
        out.append(f"mixed servers (the generated-token counter went down {f.counter_drops} times between "
                   "scrapes: the server restarted, or /metrics sits behind a load balancer and read several "
                   "servers, whose scheduler signals are mixed here: scrape one server's own address)")
    if not f.littles_ok:
        out.append(f"Little's law mismatch (L {f.littles_L_server:.1f} against lambda W {f.littles_lambda_W:.1f})")
    return out
