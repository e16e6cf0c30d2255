rule run_experiment:
    input:
        schedule=schedule_of,
        model=model_inputs(),
    output:
        directory("results/runs/{exp}"),
    log:
        "results/logs/run-{exp}.log",
    conda:
        "../../environment.yml"
    params:
        cli=FILLEDFIRST,
        configs=CONFIG_ARGS,
        spec=experiment_fingerprint,
    shell:
        # tee: progress reaches the terminal and the job's log file alike.
        "{params.cli} run {params.configs} --experiment {wildcards.exp} "
        "--schedule {input.schedule} --out {output} 2>&1 | tee {log}"
