rule ingest:
    input:
        expand("results/runs/{exp}", exp=EXPERIMENTS),
        # a capacity search's search.json stands for its probe folders
        FRONTIER_SEARCHES,
    output:
        DB,
    log:
        "results/logs/ingest.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
    shell:
        "{params.cli} ingest {input:q} --db {output:q} > {log:q} 2>&1"
        " && {params.cli} diagnose --db {output:q} {params.configs} >> {log:q} 2>&1"
