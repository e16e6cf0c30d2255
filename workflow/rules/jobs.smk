# One rule per job of the plan (filledfirst.plan), named after it: a search job (searches
# that probe exactly the same server, then the experiments placed relative to their knees
# that need that server, then the paired checks of their interventions judged side by side
# alone) or an experiment job (experiments with identical server settings). `filledfirst
# job NAME` starts the server once and runs the job's tasks in order. A search job's
# declared outputs are its search.json files (its checked interventions' too) and its
# experiments' run folders: the probe and block folders beside each search.json (pNN/,
# pairedN-side/, ordinary run folders) are
# not known before the search has run, and as undeclared files they survive an
# interrupted job, whose re-run then resumes from its finished probes. Snakemake cannot
# give one rule a varying number of outputs, hence a rule per job.
for job in PLAN.jobs:

    rule:
        name:
            job.name
        input:
            model=job.inputs.model,
            schedules=job.inputs.schedules,
            parents=job.inputs.parents,
            predicted=job.inputs.predicted,
            knees=job.inputs.knees,
            traces=job.inputs.traces,
            stats=job.inputs.stats,
        output:
            searches=job.search_outputs,
            runs=[directory(path) for path in job.run_outputs],
        log:
            job=job.log,
        # What the job asks a cluster for (the SLURM profile); a local run ignores it.
        resources:
            **job_resources(STUDY, job),
        params:
            cli=FILLEDFIRST,
            configs=CONFIG_ARGS,
            job=job.name,
            # a changed setting, workload or order of tasks re-runs the job
            fingerprint=job.fingerprint,
        shell:
            # tee: progress reaches the terminal and the job's log file alike.
            "{params.cli} job {params.configs} {params.job:q} --no-progress 2>&1 | tee {log.job:q}"


# An intervention's first rate, predicted from the searches that have run (its parent's
# knee moved by the shift the engine's fitted step time predicts): made where Snakemake
# runs, in seconds.
for step in PLAN.predictions:

    rule:
        name:
            step.name
        input:
            searches=step.searches,
        output:
            predicted=step.out,
        log:
            step.log,
        localrule: True
        params:
            cli=FILLEDFIRST,
            configs=CONFIG_ARGS,
            frontier=step.frontier,
            setting=step.setting,
            # a changed relaxation or shape predicts again
            fingerprint=step.fingerprint,
        shell:
            "{params.cli} frontier predict {params.configs} --frontier {params.frontier:q} "
            "--setting {params.setting:q} --out {output.predicted:q} {input.searches:q} > {log:q} 2>&1"
