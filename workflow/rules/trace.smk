rule fetch_trace:
    output:
        "data/traces/{trace}.csv",
    log:
        "results/logs/fetch-{trace}.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
    shell:
        "{params.cli} trace fetch {params.configs} --trace {wildcards.trace:q} --out {output:q} > {log:q} 2>&1"


# A workload whose rate is relative to a measured knee (`{of: <frontier>/<setting>, times}`)
# takes that search's search.json as an input: search, then schedule, then run.
rule schedule_from_trace:
    input:
        trace=trace_csv_of,
        knees=knee_inputs,
    output:
        schedule="data/schedules/{workload}.parquet",
        stats="data/schedules/{workload}.parquet.stats.json",
    wildcard_constraints:
        workload=one_of(TRACE_WORKLOADS),
    log:
        "results/logs/schedule-{workload}.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        spec=workload_fingerprint,
        knees=knee_args,
    shell:
        "{params.cli} trace subsample {input.trace:q} {params.configs} --workload {wildcards.workload:q} "
        "{params.knees}--out {output.schedule:q} > {log:q} 2>&1"


rule schedule_synthetic:
    input:
        knees=knee_inputs,
    output:
        schedule="data/schedules/{workload}.parquet",
        stats="data/schedules/{workload}.parquet.stats.json",
    wildcard_constraints:
        workload=one_of(SYNTHETIC_WORKLOADS),
    log:
        "results/logs/schedule-{workload}.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        spec=workload_fingerprint,
        knees=knee_args,
    shell:
        "{params.cli} workload synth {params.configs} --workload {wildcards.workload:q} "
        "{params.knees}--out {output.schedule:q} > {log:q} 2>&1"
