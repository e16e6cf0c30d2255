rule ingest:
    input:
        runs=PLAN.run_folders,
        # a search's search.json stands for its probe folders
        searches=PLAN.search_results,
    output:
        INGESTED,
    log:
        "results/logs/ingest.log",
    params:
        cli=FILLEDFIRST,
    shell:
        "{params.cli} ingest {input:q} --db {output:q} > {log:q} 2>&1"


# The labels on a copy of the measurements: new thresholds (the config's `diagnosis`)
# re-run this rule alone, never the ingest.
rule diagnose:
    input:
        INGESTED,
    output:
        DB,
    log:
        "results/logs/diagnose.log",
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        rules=DIAGNOSIS_RULES,
    shell:
        "{params.cli} diagnose --from {input:q} --db {output:q} {params.configs} > {log:q} 2>&1"
