rule report:
    input:
        db=DB,
        source=REPORT_SOURCE,
    output:
        "reports/report.html",
    log:
        "results/logs/report.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
    shell:
        "{params.cli} report --db {input.db} --source {input.source} --out {output} > {log} 2>&1"
