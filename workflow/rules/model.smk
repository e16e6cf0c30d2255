if STUDY.model.source == "tiny":

    localrules:
        tiny_model,

    rule tiny_model:
        output:
            model=directory(STUDY.model.path),
        log:
            "results/logs/model.log",
        params:
            cli=FILLEDFIRST,
            # the tiny model's shape, as `filledfirst model tiny` options
            shape=" ".join(
                f"--{key.replace('_', '-')} {int(value)}"
                for key, value in sorted(config["model"].get("tiny", {}).items())
            ),
        shell:
            "{params.cli} model tiny {output.model:q} {params.shape} > {log:q} 2>&1"
