# One job per (frontier, setting), or per group of searches that probe exactly the same
# server (filledfirst.config.search_groups), named after its first: `filledfirst frontier
# run` starts vLLM once and probes rates until each capacity search stops, then runs the
# experiments they host on that server (filledfirst.config.hosted_experiments). Its
# declared outputs are the search.json files and the hosted experiments' run folders: the
# probe folders beside each search.json (pNN/, ordinary run folders) are not known before
# the search has run, and as undeclared files they survive an interrupted job, whose re-run
# then resumes from its finished probes. Ingest reads them through search.json.
for frontier, setting in SEARCH_GROUPS:

    rule:
        name:
            f"frontier_{frontier}_{setting}"
        input:
            **frontier_inputs(frontier, setting),
        output:
            frontier_outputs(frontier, setting),
        log:
            f"results/logs/frontier-{frontier}-{setting}.log",
        # What the job asks a cluster for (the SLURM profile); a local run ignores it.
        resources:
            **frontier_resources(frontier, setting),
        conda:
            "../../environment.yml"
        params:
            cli=FILLEDFIRST,
            configs=CONFIG_ARGS,
            frontier=frontier,
            setting=setting,
            out=search_dir,
            trace=frontier_trace_args,
            then=then_args(frontier, setting),
            host=host_args(frontier, setting),
            # changes whenever anything that decides a probe or the search's path does
            spec=frontier_spec(frontier, setting),
        shell:
            "{params.cli} frontier run {params.configs} --frontier {params.frontier:q} "
            "--setting {params.setting:q} --out {params.out:q} {params.trace}{params.then}{params.host}--no-progress "
            "2>&1 | tee {log:q}"
