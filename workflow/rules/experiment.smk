# One job per server group (filledfirst.config.server_groups): its experiments run one
# after the other against one vLLM start. Snakemake cannot give a rule a varying number of
# outputs, so each group gets a rule of its own, named after the group.
for group, members in SERVER_GROUPS.items():

    rule:
        name:
            f"run_group_{group}"
        input:
            schedules=[schedule_of(exp) for exp in members],
            model=model_inputs(),
        output:
            [directory(run_dir(exp)) for exp in members],
        log:
            f"results/logs/run-{group}.log",
        # What the job asks a cluster for (the SLURM profile); a local run ignores it.
        resources:
            **cluster_resources(members),
        conda:
            "../../environment.yml"
        params:
            cli=FILLEDFIRST,
            configs=CONFIG_ARGS,
            runs=run_args(members),
            # changes whenever anything that decides a member's outcome changes
            spec=group_fingerprint(config, members),
        shell:
            # tee: progress reaches the terminal and the job's log file alike.
            "{params.cli} run {params.configs} {params.runs} 2>&1 | tee {log:q}"
