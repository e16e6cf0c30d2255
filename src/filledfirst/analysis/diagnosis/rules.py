"""The rules: one per label, each with what it needs (`matches`) and the clue it leaves
(`clue`), the thresholds in `DiagnosisRules` (the config's `diagnosis` section). The first
rule that matches names the run; a run no rule matches is unclassified, with every
pattern's unmet conditions as its clue.

What a label means to the rest of the package is on its rule too (`LABELLED` finds it):
the knob an intervention relaxes to test it (`knob`), the one number that shows it in a
stored diagnosis row (`key_number`) and what would move a knee it names
(`moves_the_knee`).

The two limits, where the server timed its requests, also need vLLM's queue to dominate
the TTFT of the requests arriving in the loaded window (gauges alone cannot tell a queue
of a few from the wait that made TTFT long); interference needs the TTFT outside that
queue to be inflated as well. The clue says which evidence was used.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

from filledfirst.analysis.diagnosis.features import Features
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.numbers import NA, count, magnitude, share
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.search import Knob
from filledfirst.study import DiagnosisRules

Check = tuple[bool, str]  # a condition and what was measured for it


class Verdict(NamedTuple):
    label: Label
    clue: str
    then_filled: str | None = None  # where two limits filled: the second, with its time


class Rule(Protocol):
    name: str  # how an unclassified run's clue names it

    def matches(self, f: Features, t: DiagnosisRules) -> bool: ...

    def verdict(self, f: Features, t: DiagnosisRules) -> Verdict: ...


class Meaning(Protocol):
    """What a label means outside the diagnosis."""

    knob: Knob | None  # what an intervention relaxes to test the label (None: nothing)
    moves_the_knee: str | None  # what would move a knee the label names (None: no single limit)


class _Labelled:
    """A rule that names one label, with its clue, and what the label means elsewhere."""

    label: Label
    knob: Knob | None = None  # what an intervention relaxes to test the label (None: nothing)
    moves_the_knee: str | None = None  # what would move a knee the label names (None: no single limit)

    @property
    def name(self) -> str:
        return str(self.label)

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        raise NotImplementedError

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        """The one number that shows the label, from the stored row."""
        if d.scrape_coverage is not None and d.scrape_coverage < t.min_scrape_coverage:
            return f"scrapes cover {share(d.scrape_coverage)} of the loaded window"
        return "no rule matched"

    def verdict(self, f: Features, t: DiagnosisRules) -> Verdict:
        return Verdict(self.label, self.clue(f, t))


class Pattern(Rule, Protocol):
    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        """What kept the pattern from matching, for the clue of a run no rule names."""
        ...


class Failed(_Labelled):
    """Nothing to judge: the run failed, recorded no request or sent none."""

    label = Label.FAILED
    moves_the_knee = "the breaking probe failed outright: fix that first (see the stop reason)"

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return "nothing measured"

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return _nothing_recorded(f) or f.n_requests == f.n_not_sent

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        if _nothing_recorded(f):
            return (f.error or "no requests recorded").strip().splitlines()[0]
        return "no request was sent"


class TooFewScrapes(_Labelled):
    """Unclassified before any pattern: the scrapes do not describe the loaded window."""

    label = Label.UNCLASSIFIED

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return self._why(f, t) is not None

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return self._why(f, t) or ""

    @staticmethod
    def _why(f: Features, t: DiagnosisRules) -> str | None:
        if f.waiting_share is None:
            return "no scheduler samples in the loaded window"
        if _lt(f.scrape_coverage, t.min_scrape_coverage):
            return (f"scrapes cover only {share(f.scrape_coverage)} of the loaded window "
                    f"(needs >= {share(t.min_scrape_coverage)})")
        scrapes = f.window_scrapes or 0
        if scrapes < t.min_window_scrapes:
            return (f"{scrapes} scrape{'s' if scrapes != 1 else ''} in the loaded window "
                    f"(needs >= {t.min_window_scrapes})")
        return None


class Interference(_Labelled):
    """Requests arriving during long prefills wait much longer for their first token
    (TTFT p90 ratio); where the server timed them, outside vLLM's queue as well."""

    label = Label.INTERFERENCE
    moves_the_knee = "a smaller prefill chunk budget (max_num_batched_tokens)"

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        ratio, unqueued = d.interference_ratio, d.interference_prefill_ratio
        outside = "" if unqueued is None else f" ({unqueued:.1f}x outside vLLM's queue)"
        return "n/a" if ratio is None else f"TTFT p90 {ratio:.1f}x higher behind a long prompt{outside}"

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        unqueued = f.interference_prefill_ratio
        return (_ge(f.interference_ratio, t.interference_min_ratio)
                and (unqueued is None or unqueued >= t.interference_min_prefill_ratio))

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        head = f"{f.n_during} requests arriving during long prefills"
        if f.interference_prefill_ratio is None:
            return f"{head}: {_ttft(f)} (" + (
                "TTFT alone: too few of them with per-request server timings)" if f.window_timed else
                "gauges and client times: no per-request server timings, long prefills counted from their send)")
        return (f"{head} (vLLM's prefill intervals): {_ttft(f)}; outside vLLM's queue "
                f"{f.interference_prefill_ratio:.1f}x (its per-request timings)")

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        # only a TTFT ratio that passed is worth explaining
        unqueued = f.interference_prefill_ratio
        if not _ge(f.interference_ratio, t.interference_min_ratio) or unqueued is None:
            return []
        return [f"{_ttft(f)} but outside vLLM's queue {unqueued:.1f}x (needs >= {t.interference_min_prefill_ratio:g}x)"]


class _Conditions(_Labelled):
    """A pattern that matches when all its conditions hold."""

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        raise NotImplementedError

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return all(ok for ok, _ in self.conditions(f, t))

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        return [", ".join(text for ok, text in self.conditions(f, t) if not ok)]


class KvPressure(_Conditions):
    """KV full (or at a peak with preemptions) and requests waiting, with sequence headroom."""

    label = Label.KV_PRESSURE
    knob = Knob.KV
    moves_the_knee = "more KV blocks (memory for the cache), a shorter max_model_len or a smaller KV dtype"

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return f"KV >= {t.kv_full_pct:g} % for {share(d.kv_full_share)} of the time{_queue_number(d)}"

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        return [
            _kv_full(f, t),
            _waiting(f, t),
            _cap_headroom(f, t),
            *_queue(f, t),
        ]

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"KV at or above {t.kv_full_pct:g} % for {share(f.kv_full_share)} of the loaded time, "
                f"{f.window_preemptions or 0:.0f} preemptions, "
                f"running at most {count(f.window_running_max, NA, grouped=False)}{_of(f)}, "
                f"waiting in {share(f.waiting_share)} of the time{_cap_note(f)}{_queue_evidence(f)}")


class PrefixEviction(_Conditions):
    """The prefix cache lost its reuse to a KV pool too small for it: the trace offered
    reuse (an unbounded cache would have served a good share of the prompt tokens), the
    cache on served far less of it, and requests waited, with sequence headroom. The prompts
    whose shared blocks were evicted are computed again, so the prefill grows with the load
    instead of shrinking with reuse.

    KV need not read full here: vLLM counts a cached block that no running request holds
    as free (its usage gauge is what running requests hold), and it is exactly those blocks
    that the next allocation evicts, so a pool whose running requests hold 70 % of it can
    evict every shared prefix before it comes round again. The low share served, with the
    cache on, is the evidence that the pool was too small for the reuse; the gauge is only
    quoted. Plain KV-capacity pressure is a queue with KV full and no reuse to lose (none
    offered, the cache off, or the cache still delivering it)."""

    label = Label.PREFIX_EVICTION
    knob = Knob.KV
    moves_the_knee = ("more KV blocks, so the shared prefixes stay cached (or routing that keeps a "
                      "conversation on one server)")

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return (f"cache hits {share(d.measured_hit_share)} of prompt tokens against "
                f"{share(d.ideal_hit_share)} offered, KV >= {t.kv_full_pct:g} % for "
                f"{share(d.kv_full_share)} of the time{_queue_number(d)}")

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        return [
            _check(f.prefix_caching is True, f"prefix caching {_on_off(f.prefix_caching)}", "on"),
            _check(_ge(f.ideal_hit_share, t.eviction_min_ideal_share),
                   f"an unbounded cache would have served {share(f.ideal_hit_share)} of the prompt tokens",
                   f">= {share(t.eviction_min_ideal_share)}"),
            _check(_lt(f.cache_efficiency, t.eviction_max_efficiency),
                   f"the cache served {share(f.cache_efficiency)} of that", f"< {share(t.eviction_max_efficiency)}"),
            _waiting(f, t),
            _cap_headroom(f, t),
            *_queue(f, t),
        ]

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        # no reuse offered, or no cache to lose it: not a near miss worth explaining
        return super().unmet(f, t) if f.prefix_caching and f.ideal_hit_share else []

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"the prefix cache served {share(f.measured_hit_share)} of the prompt tokens where an unbounded one "
                f"would have served {share(f.ideal_hit_share)} ({share(f.cache_efficiency)} of the reuse the trace "
                f"offered), waiting in {share(f.waiting_share)} of the time, running at most "
                f"{count(f.window_running_max, NA, grouped=False)}{_of(f)}; KV held by running requests at most "
                f"{magnitude(f.window_kv_max_pct)} %, at or above {t.kv_full_pct:g} % for {share(f.kv_full_share)} "
                f"of the loaded time, {f.window_preemptions or 0:.0f} preemptions{_queue_evidence(f)}")


class BothLimits(_Conditions):
    """KV full and running at the cap, with requests waiting: both limits filled in the
    loaded window. What filled first is the one whose crossing came first on the run's
    clock (running first at the cap, KV first at or above kv_full_pct); the clue names
    the other, with its time. Crossed at the same scrape: the one that held for the
    larger share of the window."""

    name = "both limits"

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        return [
            _kv_full(f, t),
            _check(_ge(f.running_at_cap_share, t.kv_pressure_max_cap_share), _at_cap(f),
                   f">= {share(t.kv_pressure_max_cap_share)}"),
            _waiting(f, t),
            *_queue(f, t),
        ]

    def first(self, f: Features) -> tuple[Label, Label]:
        cap_t, kv_t = f.t_first_cap_s, f.t_first_kv_s
        if cap_t is not None and kv_t is not None and cap_t != kv_t:
            cap_first = cap_t < kv_t
        elif cap_t is None or kv_t is None:
            cap_first = kv_t is None
        else:
            cap_first = (f.running_at_cap_share or 0) >= (f.kv_full_share or 0)
        return (Label.SEQ_LIMIT, Label.KV_PRESSURE) if cap_first else (Label.KV_PRESSURE, Label.SEQ_LIMIT)

    def verdict(self, f: Features, t: DiagnosisRules) -> Verdict:
        first, second = self.first(f)
        t_second = f.t_first_kv_s if second is Label.KV_PRESSURE else f.t_first_cap_s
        return Verdict(first, self.clue(f, t), f"{second} at {_at(t_second)}")

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        first, second = self.first(f)
        cap = f"running at the cap from {_at(f.t_first_cap_s)}"
        kv = f"KV >= {t.kv_full_pct:g} % from {_at(f.t_first_kv_s)}"
        order = f"{cap}, {kv}" if first is Label.SEQ_LIMIT else f"{kv}, {cap}"
        same = f.t_first_cap_s is not None and f.t_first_cap_s == f.t_first_kv_s
        return (f"both filled, {first} first{' (the same scrape: it held longer)' if same else ''}: {order}; "
                f"at the cap for {share(f.running_at_cap_share)} and KV >= {t.kv_full_pct:g} % for "
                f"{share(f.kv_full_share)} of the loaded time, {f.window_preemptions or 0:.0f} preemptions, "
                f"waiting in {share(f.waiting_share)} of the time{_queue_evidence(f)}")


class SeqLimit(_Conditions):
    """Running at max_num_seqs and requests waiting while KV has room."""

    label = Label.SEQ_LIMIT
    knob = Knob.SEQS
    moves_the_knee = "more sequences (max_num_seqs): the cap is full while KV has headroom"

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return f"running at the cap {share(d.running_at_cap_share)} of the time{_queue_number(d)}"

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        preempted = f.window_preemptions or 0
        return [
            _check(_ge(f.running_at_cap_share, t.seq_limit_min_cap_share), _at_cap(f),
                   f">= {share(t.seq_limit_min_cap_share)}"),
            _waiting(f, t),
            _check(_lt(f.window_kv_median_pct, t.kv_full_pct), f"KV median {magnitude(f.window_kv_median_pct)} %",
                   f"< {t.kv_full_pct:g} %"),
            _check(_lt(f.kv_full_share, t.seq_limit_max_kv_full_share) and preempted <= t.seq_limit_max_preemptions,
                   f"KV full {share(f.kv_full_share)}, {count(preempted, NA, grouped=False)} preemptions",
                   f"< {share(t.seq_limit_max_kv_full_share)} and "
                   + ("none" if t.seq_limit_max_preemptions == 0 else f"<= {t.seq_limit_max_preemptions}")),
            *_queue(f, t),
        ]

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        assert f.cap is not None  # at the cap for a share of the time: the cap is known
        return (f"running at >= {math.ceil(t.cap_frac * f.cap * f.engines)}{_of(f)} for "
                f"{share(f.running_at_cap_share)} "
                f"of the loaded time while KV median was {magnitude(f.window_kv_median_pct)} %{_queue_evidence(f)}")


class TokenBudget(_Conditions):
    """Requests queued with neither the cap nor KV full, while the engine's steps used (on
    average) nearly all of the per-step token budget (max_num_batched_tokens): vLLM's
    scheduler admits waiting requests while a step's budget has room, so a queue behind
    full steps waited for the budget, typically long prompts taking it chunk by chunk."""

    label = Label.TOKEN_BUDGET
    moves_the_knee = "a larger per-step token budget (max_num_batched_tokens), if the steps' time allows"

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return (f"steps used {share(d.budget_fill)} of the token budget ({d.token_budget}) "
                f"while requests waited{_queue_number(d)}")

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        queued, *neither_full = _queue_none_full(f, t)
        return [
            queued, *_queue(f, t), *neither_full,
            _check(_ge(f.budget_fill, t.budget_min_fill), _budget_steps(f), f">= {share(t.budget_min_fill)}"),
        ]

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"requests queued ({_queue_seen(f)}) and {_budget_steps(f)}; running at most "
                f"{count(f.window_running_max, NA, grouped=False)}{_of(f)}, KV at most "
                f"{magnitude(f.window_kv_max_pct)} %{_queue_evidence(f)}")


class Reference(_Conditions):
    """Nothing filled: little waiting, running below the cap, KV rarely full."""

    label = Label.REFERENCE

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return f"waiting {share(d.waiting_share)} of the time"

    def conditions(self, f: Features, t: DiagnosisRules) -> list[Check]:
        return [
            _check(_lt(f.waiting_share, t.reference_max_waiting_share), f"waiting {share(f.waiting_share)}",
                   f"< {share(t.reference_max_waiting_share)}"),
            _check(_lt(f.running_at_cap_share, t.reference_max_cap_share), _at_cap(f),
                   f"< {share(t.reference_max_cap_share)}"),
            _check(_lt(f.kv_full_share, t.reference_max_kv_full_share), f"KV full {share(f.kv_full_share)}",
                   f"< {share(t.reference_max_kv_full_share)}"),
            # a bursty run queues in short bursts: little of the time, much of its requests' TTFT
            *([] if not f.window_timed else [
                _check(_lt(f.window_queue_share, t.reference_max_queue_share),
                       f"vLLM's queue {share(f.window_queue_share)} of TTFT",
                       f"< {share(t.reference_max_queue_share)}")]),
        ]

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"waiting {share(f.waiting_share)} of the time, "
                f"running median {count(f.window_running_median, NA, grouped=False)}{_of(f)}, "
                f"KV median {magnitude(f.window_kv_median_pct)} %{_cap_note(f)}")


class FullNotLimiting(_Labelled):
    """Unclassified, said plainly: a limit was reached but nothing queued (a closed loop at
    the cap, KV filling without requests waiting), so nothing it held back shows."""

    label = Label.UNCLASSIFIED

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        full = _kv_full(f, t)[0] or _ge(f.running_at_cap_share, t.reference_max_cap_share)
        return full and not _queued(f, t)

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        full = [text for ok, text in (
            (_ge(f.running_at_cap_share, t.reference_max_cap_share),
             f"running at the cap {share(f.running_at_cap_share)}"),
            (_kv_full(f, t)[0], f"KV >= {t.kv_full_pct:g} % for {share(f.kv_full_share)}")) if ok]
        return (f"{' and '.join(full)} of the loaded time, but nothing queued ({_queue_seen(f)}): "
                "full, not yet what limits")


class QueueNoneFull(_Labelled):
    """Unclassified, said plainly: requests queued while neither the cap nor KV was full,
    and the steps at the token budget do not say it filled (too few of them, or not
    counted): something else held them, or the evidence is missing."""

    label = Label.UNCLASSIFIED

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return all(ok for ok, _ in _queue_none_full(f, t))

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"requests queued ({_queue_seen(f)}) with neither limit full (running at most "
                f"{count(f.window_running_max, NA, grouped=False)}{_of(f)}, at the cap "
                f"{share(f.running_at_cap_share)}; KV at most {magnitude(f.window_kv_max_pct)} %) "
                f"and {_budget_steps(f)}"
                # a TTFT ratio that passed but whose wait was vLLM's queue: both numbers
                + "".join(f"; {Label.INTERFERENCE}: {why}" for why in Interference().unmet(f, t)))


GATES: tuple[Rule, ...] = (Failed(), TooFewScrapes())
PATTERNS: tuple[Pattern, ...] = (  # in the order they win
    Interference(), PrefixEviction(), KvPressure(), SeqLimit(), BothLimits(), TokenBudget(), Reference())
# No pattern, but the evidence says why in a sentence: said so instead of every rule's unmet list.
EXPLAINED: tuple[Rule, ...] = (FullNotLimiting(), QueueNoneFull())


def _by_label() -> dict[Label, _Labelled]:
    """label -> the rule that carries what it means (unclassified: the first of its rules;
    they differ only in their clue)."""
    out: dict[Label, _Labelled] = {}
    for rule in (*GATES, *PATTERNS, *EXPLAINED):
        if isinstance(rule, _Labelled) and hasattr(rule, "label"):  # both limits names two
            out.setdefault(rule.label, rule)
    return out


LABELLED = _by_label()


def labelled(label: str | None) -> _Labelled:
    """The rule that carries a stored label's meaning (no label or an unknown one: unclassified's)."""
    try:
        return LABELLED[Label(label)]
    except ValueError:
        return LABELLED[Label.UNCLASSIFIED]


def judge(f: Features, t: DiagnosisRules) -> Verdict:
    """The run's label and its clue (and, where two limits filled, the second)."""
    for rule in (*GATES, *PATTERNS, *EXPLAINED):
        if rule.matches(f, t):
            return rule.verdict(f, t)
    return Verdict(Label.UNCLASSIFIED, "fits no pattern: " + "; ".join(
        f"{rule.name}: {why}" for rule in PATTERNS for why in rule.unmet(f, t)))


def _nothing_recorded(f: Features) -> bool:
    return f.status == "failed" or not f.n_requests


def _check(ok: bool, measured: str, needs: str) -> Check:
    return ok, f"{measured} (needs {needs})"


def _ge(a: float | None, b: float) -> bool:
    return a is not None and a >= b


def _lt(a: float | None, b: float) -> bool:
    return a is not None and a < b


def _ttft(f: Features) -> str:
    return f"TTFT p90 {f.interference_ratio:.1f}x that of the other {f.n_apart}"


def _at(t_s: float | None) -> str:
    return "never" if t_s is None else f"{t_s:.1f} s"


def _kv_full(f: Features, t: DiagnosisRules) -> Check:
    kv_full = (_ge(f.kv_full_share, t.kv_full_min_share)
               or (_ge(f.window_kv_max_pct, t.kv_peak_pct) and (f.window_preemptions or 0) > 0))
    return _check(kv_full, f"KV >= {t.kv_full_pct:g} % for {share(f.kv_full_share)}",
                  f"{share(t.kv_full_min_share)}, or a peak >= {t.kv_peak_pct:g} % with preemptions")


def _cap_headroom(f: Features, t: DiagnosisRules) -> Check:
    """Running at the cap for less of the window than a full cap needs (an unknown cap is no
    headroom: nothing says the cap was not reached)."""
    return _check(_lt(f.running_at_cap_share, t.kv_pressure_max_cap_share), _at_cap(f),
                  f"< {share(t.kv_pressure_max_cap_share)}")


def _queued(f: Features, t: DiagnosisRules) -> bool:
    """Requests waited, by the time or by the requests: a queue for a share of the window a
    limit's label needs, or (where the server timed them) vLLM's queue more of their TTFT
    than a reference run allows."""
    return _ge(f.waiting_share, t.waiting_min_share) or (
        f.window_timed > 0 and _ge(f.window_queue_share, t.reference_max_queue_share))


def _queue_seen(f: Features) -> str:
    seen = f"waiting {share(f.waiting_share)} of the time"
    return seen + (f", vLLM's queue {share(f.window_queue_share)} of TTFT" if f.window_timed else "")


def _waiting(f: Features, t: DiagnosisRules) -> Check:
    return _check(_ge(f.waiting_share, t.waiting_min_share), f"waiting {share(f.waiting_share)}",
                  f">= {share(t.waiting_min_share)}")


def _queue(f: Features, t: DiagnosisRules) -> list[Check]:
    """vLLM's queue share of TTFT, where the server timed its requests (no condition without)."""
    if not f.window_timed:
        return []
    return [_check(_ge(f.window_queue_share, t.queue_min_ttft_share),
                   f"vLLM's queue {share(f.window_queue_share)} of TTFT", f">= {share(t.queue_min_ttft_share)}")]


def _queue_none_full(f: Features, t: DiagnosisRules) -> list[Check]:
    """Requests queued (by the time or by the requests) with neither the cap nor KV full."""
    return [
        _check(_queued(f, t), _queue_seen(f),
               f"waiting >= {share(t.waiting_min_share)} of the time, or vLLM's queue "
               f">= {share(t.reference_max_queue_share)} of TTFT"),
        _cap_headroom(f, t),
        _check(not _kv_full(f, t)[0], f"KV >= {t.kv_full_pct:g} % for {share(f.kv_full_share)}",
               f"< {share(t.kv_full_min_share)}, and no peak >= {t.kv_peak_pct:g} % with preemptions"),
    ]


def _budget_steps(f: Features) -> str:
    """How much of the token budget the steps used while requests waited, or why not known."""
    if f.token_budget is None:
        return "the per-step token budget unknown (its use not measured)"
    if f.budget_queued_steps is None:
        return f"the use of the token budget ({f.token_budget}) not measured (no step histogram)"
    if not f.budget_queued_steps:
        return f"no engine step while requests waited (token budget {f.token_budget})"
    return (f"the {count(f.budget_queued_steps, NA)} engine steps while requests waited used "
            f"{share(f.budget_fill)} of the token budget ({f.token_budget}) on average")


def _on_off(flag: bool | None) -> str:
    return "unknown" if flag is None else "on" if flag else "off"


def _at_cap(f: Features) -> str:
    cap_share = f.running_at_cap_share
    return f"running at cap {share(cap_share) if cap_share is not None else 'unknown (no max_num_seqs)'}"


def _of(f: Features) -> str:
    cap, engines = f.cap, f.engines
    return "" if cap is None else f" of {cap}" if engines == 1 else f" of {engines} x {cap}"


def _cap_note(f: Features) -> str:
    return "" if f.cap is not None else "; max_num_seqs unknown: no at-cap signal"


def _queue_number(d: DiagnosisRow) -> str:
    """Where the server timed its requests, a limit's label also rests on its queue."""
    return f", vLLM's queue {share(d.window_queue_share)} of TTFT" if d.window_timed else ""


def _queue_evidence(f: Features) -> str:
    """What a limit's label rests on beyond the gauges, for its clue."""
    if not f.window_timed:
        return "; gauges only: the server reported no per-request timings"
    return (f"; vLLM's queue was {share(f.window_queue_share)} of the TTFT of the {f.window_timed} "
            "requests arriving in the loaded window (its per-request timings)")
