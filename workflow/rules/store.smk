rule ingest:
    input:
        runs=PLAN.run_folders,
        # a search's search.json stands for its probe folders
        searches=PLAN.search_results,
    output:
        db=INGESTED,
    log:
        "results/logs/ingest.log",
    params:
        cli=FILLEDFIRST,
    shell:
        "{params.cli} ingest {input:q} --db {output.db:q} > {log:q} 2>&1"


# The labels on a copy of the measurements: new thresholds (the config's `diagnosis`)
# re-run this rule alone, never the ingest.
rule diagnose:
    input:
        ingested=INGESTED,
    output:
        db=DB,
    log:
        "results/logs/diagnose.log",
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        rules=DIAGNOSIS_RULES,
    shell:
        "{params.cli} diagnose --from {input.ingested:q} --db {output.db:q} {params.configs} > {log:q} 2>&1"
