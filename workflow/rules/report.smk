rule report:
    input:
        db=DB,
        source=REPORT_SOURCE,
        compare=[COMPARE_HTML] if COMPARE_BASELINE else [],
    output:
        html="reports/report.html",
    log:
        "results/logs/report.log",
    params:
        cli=FILLEDFIRST,
        # a new title re-renders the report alone (Snakemake re-runs on changed params)
        title=f"--title {shlex.quote(STUDY.report.title)}" if STUDY.report.title else "",
        # the comparison sits beside the report
        compare=f"--compare {os.path.basename(COMPARE_HTML)}" if COMPARE_BASELINE else "",
        publish="--publish" if STUDY.report.publish else "",
    shell:
        "{params.cli} report --db {input.db:q} --source {input.source:q} --out {output.html:q} {params.title} "
        "{params.compare} {params.publish} > {log:q} 2>&1"


if COMPARE_BASELINE:

    localrules:
        compare,

    # Never fails on the gate: the job's outputs stay. A scheduled job asks
    # `filledfirst compare` itself for the exit status (docs/compare.md).
    rule compare:
        input:
            db=DB,
            baseline=COMPARE_BASELINE,
        output:
            html=COMPARE_HTML,
            db=COMPARE_DB,
        log:
            "results/logs/compare.log",
        params:
            cli=FILLEDFIRST,
            config=CONFIG_ARGS,
        shell:
            "{params.cli} compare {input.baseline:q} {input.db:q} --out {output.html:q} --db {output.db:q} "
            "{params.config} --no-fail > {log:q} 2>&1"
