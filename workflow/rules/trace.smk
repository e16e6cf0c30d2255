rule fetch_trace:
    output:
        csv="data/traces/{trace}.csv",
    log:
        "results/logs/fetch-{trace}.log",
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
    shell:
        "{params.cli} trace fetch {params.configs} --trace {wildcards.trace:q} --out {output.csv:q} > {log:q} 2>&1"


# A workload whose rate is relative to a measured knee (`{of: <frontier>/<setting>, times}`)
# takes that search's search.json as an input: search, then schedule, then run. The
# command reads the knees where the plan puts them.
rule schedule_from_trace:
    input:
        trace=lambda wildcards: PLAN.schedules[wildcards.workload].trace_csv,
        knees=schedule_knees,
    output:
        schedule="data/schedules/{workload}.parquet",
        stats="data/schedules/{workload}.parquet.stats.json",
    log:
        "results/logs/schedule-{workload}.log",
    wildcard_constraints:
        workload=one_of(TRACE_WORKLOADS),
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        fingerprint=schedule_fingerprint,
    shell:
        "{params.cli} trace subsample {input.trace:q} {params.configs} --workload {wildcards.workload:q} "
        "--out {output.schedule:q} > {log:q} 2>&1"


rule schedule_synthetic:
    input:
        knees=schedule_knees,
    output:
        schedule="data/schedules/{workload}.parquet",
        stats="data/schedules/{workload}.parquet.stats.json",
    log:
        "results/logs/schedule-{workload}.log",
    wildcard_constraints:
        workload=one_of(SYNTHETIC_WORKLOADS),
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        fingerprint=schedule_fingerprint,
    shell:
        "{params.cli} workload synth {params.configs} --workload {wildcards.workload:q} "
        "--out {output.schedule:q} > {log:q} 2>&1"
