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
        # a new title re-renders the report alone (Snakemake re-runs on changed params)
        title=f"--title {shlex.quote(STUDY.report.title)}" if STUDY.report.title else "",
    shell:
        "{params.cli} report --db {input.db:q} --source {input.source:q} --out {output:q} {params.title} > {log:q} 2>&1"
