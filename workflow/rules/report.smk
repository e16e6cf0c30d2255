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
        "{params.cli} report --db {input.db:q} --source {input.source:q} --out {output:q} > {log:q} 2>&1"
