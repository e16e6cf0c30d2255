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

from typing import NamedTuple, Protocol

from filledfirst.analysis.diagnosis.features import Features
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.numbers import NA, count, magnitude, share
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.scheduler import Constraint
from filledfirst.contracts.search import Knob
from filledfirst.study import DiagnosisRules

Check = tuple[bool, str]  # a condition and what was measured for it


class Verdict(NamedTuple):
    label: Label
    clue: str
    then_filled: str | None = None  # where two limits held the waiting: the second, with its share
    held_by: Label | None = None  # the label of what held most of the waiting (whatever the run's label)


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


class PrefixEviction(_Conditions):
    """The prefix cache lost its reuse to a KV pool too small for it: the trace offered
    reuse (an unbounded cache would have served a good share of the prompt tokens), the
    cache on served far less of it, and requests waited for something other than the cap
    (blocks, or the steps that compute the evicted prefixes again). The prompts
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
            _check(_queued(f, t), _queue_seen(f),
                   f"waiting >= {share(t.waiting_min_share)} of the time, or vLLM's queue "
                   f">= {share(t.queue_min_ttft_share)} of TTFT"),
            _check(bool(f.bindings.shares) and f.bindings.shares[0][0] is not Constraint.CAP,
                   f"held {f.bound or 'by nothing a scrape saw'}", "mostly by something other than the cap"),
        ]

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        # no reuse offered, or no cache to lose it: not a near miss worth explaining
        return super().unmet(f, t) if f.prefix_caching and f.ideal_hit_share else []

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"the prefix cache served {share(f.measured_hit_share)} of the prompt tokens where an unbounded one "
                f"would have served {share(f.ideal_hit_share)} ({share(f.cache_efficiency)} of the reuse the trace "
                f"offered); {_waiting_seen(f)}; KV held by running requests at most "
                f"{magnitude(f.window_kv_max_pct)} %, {f.window_preemptions or 0:.0f} preemptions{_queue_evidence(f)}")


class _Bound(_Labelled):
    """Requests waited, and what held them most (weighted by the requests waiting:
    filledfirst.analysis.diagnosis.scheduler) is one of this label's `constraints`."""

    constraints: tuple[Constraint, ...]

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        first = bound_labels(f)
        return _queued(f, t) and bool(first) and first[0][0] is self.label

    def verdict(self, f: Features, t: DiagnosisRules) -> Verdict:
        shares = bound_labels(f)
        then = (f"{shares[1][0]} ({share(shares[1][1])} of the waiting)"
                if len(shares) > 1 and shares[1][1] >= t.next_min_share else None)
        return Verdict(self.label, self.clue(f, t), then)

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return f"{self.held(f, t)}{_engines(f)}; {_waiting_seen(f)}{_cap_note(f)}{_queue_evidence(f)}"

    def held(self, f: Features, t: DiagnosisRules) -> str:
        raise NotImplementedError

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return f"waiting held by {d.bound or 'nothing a scrape saw'}{_queue_number(d)}"

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        return []


def _engines(f: Features) -> str:
    """Data-parallel engines that differ in what held them, each with its own."""
    per = f.bindings.per_engine
    return "" if not per else "; engine by engine: " + ", ".join(f"{e} {c}" for e, c in per)


class KvPressure(_Bound):
    """The requests waited for KV blocks: the head of the queue needed more blocks than
    were free (vLLM admits in order and stops at the first that does not fit), or a
    running request's growth took the blocks and the engine preempted it."""

    label = Label.KV_PRESSURE
    constraints = (Constraint.KV, Constraint.PREEMPTION)
    knob = Knob.KV
    moves_the_knee = "more KV blocks (memory for the cache), a shorter max_model_len or a smaller KV dtype"

    def held(self, f: Features, t: DiagnosisRules) -> str:
        b = f.bindings
        head = ("" if b.head_blocks is None else
                f": the head of the queue needed {b.head_blocks} blocks with {count(b.blocks_free, NA)} free "
                f"(KV {magnitude(b.kv_pct)} % used)")
        return (f"KV blocks held {share(_of_constraints(f, Constraint.KV))} of the waiting and preemptions "
                f"{share(_of_constraints(f, Constraint.PREEMPTION))}{head}; "
                f"{f.window_preemptions or 0:.0f} preemptions, KV at most {magnitude(f.window_kv_max_pct)} %")


class SeqLimit(_Bound):
    """The requests waited for a slot: running at the cap in effect (vLLM admits nobody
    while the running set is at max_num_seqs)."""

    label = Label.SEQ_LIMIT
    constraints = (Constraint.CAP,)
    knob = Knob.SEQS
    moves_the_knee = "more sequences (max_num_seqs): the cap is full while KV has headroom"

    def held(self, f: Features, t: DiagnosisRules) -> str:
        return (f"the cap held {share(_of_constraints(f, Constraint.CAP))} of the waiting "
                f"(running at most {count(f.window_running_max, NA, grouped=False)}{_of(f)}, KV median "
                f"{magnitude(f.window_kv_median_pct)} %)")


class TokenBudget(_Bound):
    """The requests waited for room in a step: the steps carried the whole per-step token
    budget (max_num_batched_tokens), typically long prompts taking it chunk by chunk."""

    label = Label.TOKEN_BUDGET
    constraints = (Constraint.BUDGET,)
    moves_the_knee = "a larger per-step token budget (max_num_batched_tokens), if the steps' time allows"

    def held(self, f: Features, t: DiagnosisRules) -> str:
        return (f"full steps held {share(_of_constraints(f, Constraint.BUDGET))} of the waiting "
                f"({_budget_steps(f)})")


class ComputeBound(_Bound):
    """The requests waited with no limit full: the cap had slots, the head fitted in the
    free blocks and the steps had budget left, so each waited for the step in flight to
    end. The engine's step time is the limit; prefill or decode by the tokens those steps
    computed. Or nothing queued and yet too few requests met the SLO: every request was
    admitted, and the steps themselves were too slow for it (prefill where TTFT missed,
    decode where only the gaps between tokens did)."""

    label = Label.COMPUTE
    constraints = (Constraint.COMPUTE,)
    moves_the_knee = "faster steps: more compute, or less work per step (shorter prompts, a smaller batch)"

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return super().matches(f, t) or (not _queued(f, t) and not _gauges_queued(f, t) and _too_slow(f, t))

    def verdict(self, f: Features, t: DiagnosisRules) -> Verdict:
        if _queued(f, t):
            return super().verdict(f, t)
        met = f.window_slo_met_share or 0
        phase = "prefill" if (f.ttft_over or 0) >= (1 - met) * f.window_answered / 2 else "decode"
        return Verdict(self.label, (
            f"nothing queued ({_queue_seen(f)}) yet {share(met)} of the answered requests arriving in the "
            f"loaded window met the SLO (TTFT <= "
            f"{t.slo_ttft_ms:g} ms, no gap above {t.slo_itl_ms:g} ms; needs >= {share(t.slo_min_met_share)}): the "
            f"steps were too slow, {phase} ({f.ttft_over or 0} over the TTFT objective, TTFT p90 "
            f"{count(f.ttft_p90_ms, NA)} ms)"))

    def held(self, f: Features, t: DiagnosisRules) -> str:
        b = f.bindings
        phase = "prefill" if (b.prefill_share or 0) >= 0.5 else "decode"
        mix = "" if b.prefill_share is None else f", {share(b.prefill_share)} of their tokens prompt: {phase}"
        steps = "" if b.step_ms is None else f"; steps took {b.step_ms:.0f} ms on average{mix}"
        if f.budget_fill is None:  # nothing says the steps had budget left
            steps += f"; the token budget not tested ({_budget_steps(f)})"
        return (f"the step in flight held {share(_of_constraints(f, Constraint.COMPUTE))} of the waiting, "
                f"with no limit full{steps}"
                # a TTFT ratio that passed but whose wait was vLLM's queue: both numbers
                + "".join(f" ({Label.INTERFERENCE}: {why})" for why in Interference().unmet(f, t)))


class Reference(_Labelled):
    """Nothing held the requests: they did not queue (the cap, KV or the budget may have
    been full, but nobody waited for it)."""

    label = Label.REFERENCE

    def key_number(self, d: DiagnosisRow, t: DiagnosisRules) -> str:
        return f"waiting {share(d.waiting_share)} of the time{_queue_number(d)}"

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return not _queued(f, t) and not _gauges_queued(f, t) and not _too_slow(f, t)

    def unmet(self, f: Features, t: DiagnosisRules) -> list[str]:
        return []

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"nothing queued ({_queue_seen(f)}), running median "
                f"{count(f.window_running_median, NA, grouped=False)}{_of(f)}, KV median "
                f"{magnitude(f.window_kv_median_pct)} %{_cap_note(f)}")


class QueuedUnseen(_Labelled):
    """Unclassified, said plainly: requests queued (vLLM's queue was much of their TTFT)
    but no scrape saw one waiting, so no scrape says what held them: the scrapes were too
    far apart for the bursts."""

    label = Label.UNCLASSIFIED

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return _queued(f, t) and not f.bindings.shares

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return f"requests queued ({_queue_seen(f)}) but no scrape saw one waiting: scrape more often"


class WaitedElsewhere(_Labelled):
    """Unclassified, said plainly: the gauges saw requests waiting, but vLLM's per-request
    timings put little of their TTFT in its queue (and nothing was preempted): their wait
    was elsewhere (the request path shows where), which no scheduler limit explains."""

    label = Label.UNCLASSIFIED

    def matches(self, f: Features, t: DiagnosisRules) -> bool:
        return _gauges_queued(f, t) and not _queued(f, t)

    def clue(self, f: Features, t: DiagnosisRules) -> str:
        return (f"the gauges saw requests waiting {share(f.waiting_share)} of the time, but vLLM's queue was only "
                f"{share(f.window_queue_share)} of their TTFT (needs >= {share(t.queue_min_ttft_share)}): "
                "they waited outside its queue")


GATES: tuple[Rule, ...] = (Failed(), TooFewScrapes())
PATTERNS: tuple[Pattern, ...] = (  # in the order they win
    Interference(), PrefixEviction(), KvPressure(), SeqLimit(), TokenBudget(), ComputeBound(), Reference())
# No pattern, but the evidence says why in a sentence: said so instead of every rule's unmet list.
EXPLAINED: tuple[Rule, ...] = (QueuedUnseen(), WaitedElsewhere())
BOUND: tuple[_Bound, ...] = tuple(rule for rule in PATTERNS if isinstance(rule, _Bound))


def bound_labels(f: Features) -> list[tuple[Label, float]]:
    """The labels of what held the waiting requests, with their shares of it, largest first
    (a label's constraints added up)."""
    out: dict[Label, float] = {}
    for constraint, part in f.bindings.shares:
        label = next(rule.label for rule in BOUND if constraint in rule.constraints)
        out[label] = out.get(label, 0.0) + part
    return sorted(out.items(), key=lambda x: -x[1])


def _by_label() -> dict[Label, _Labelled]:
    """label -> the rule that carries what it means (unclassified: the first of its rules;
    they differ only in their clue)."""
    out: dict[Label, _Labelled] = {}
    for rule in (*GATES, *PATTERNS, *EXPLAINED):
        if isinstance(rule, _Labelled):
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
    held = bound_labels(f)
    for rule in (*GATES, *PATTERNS, *EXPLAINED):
        if rule.matches(f, t):
            return rule.verdict(f, t)._replace(held_by=held[0][0] if held else None)
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


def _queued(f: Features, t: DiagnosisRules) -> bool:
    """Requests waited in vLLM's queue: where the server timed them, its queue a share of
    their TTFT; else (or where preemptions put requests back in the queue, whose second
    wait the timings count as prefill) a waiting queue a share of the window's time."""
    if f.window_timed and _ge(f.window_queue_share, t.queue_min_ttft_share):
        return True
    return _gauges_queued(f, t) and (not f.window_timed or (f.window_preemptions or 0) > 0)


def _too_slow(f: Features, t: DiagnosisRules) -> bool:
    """Too few of the answered requests arriving in the loaded window met the SLO (a failed
    one says nothing of speed; a closed loop's first requests arrive together, before it)."""
    return _lt(f.window_slo_met_share, t.slo_min_met_share)


def _gauges_queued(f: Features, t: DiagnosisRules) -> bool:
    return _ge(f.waiting_share, t.waiting_min_share)


def _queue_seen(f: Features) -> str:
    seen = f"waiting {share(f.waiting_share)} of the time"
    return seen + (f", vLLM's queue {share(f.window_queue_share)} of TTFT" if f.window_timed else "")


def _of_constraints(f: Features, *constraints: Constraint) -> float:
    return sum(part for c, part in f.bindings.shares if c in constraints)


def _waiting_seen(f: Features) -> str:
    return f"{_queue_seen(f)}, {f.waited_request_s or 0:.1f} request-seconds of waiting seen by the scrapes"


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
    return "" if f.cap is not None else "; max_num_seqs unknown: the cap not tested"


def _queue_number(d: DiagnosisRow) -> str:
    """Where the server timed its requests, a limit's label also rests on its queue."""
    return f", vLLM's queue {share(d.window_queue_share)} of TTFT" if d.window_timed else ""


def _queue_evidence(f: Features) -> str:
    """What a limit's label rests on beyond the gauges, for its clue."""
    if not f.window_timed:
        return "; gauges only: the server reported no per-request timings"
    return (f"; vLLM's queue was {share(f.window_queue_share)} of the TTFT of the {f.window_timed} "
            "requests arriving in the loaded window (its per-request timings)")
