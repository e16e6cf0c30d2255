rule ingest:
    input:
        expand("results/runs/{exp}", exp=EXPERIMENTS),
    output:
        DB,
    log:
        "results/logs/ingest.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
    shell:
        "{params.cli} ingest {input} --db {output} > {log} 2>&1"
