if config["model"]["source"] == "tiny":

    localrules:
        tiny_model,


    rule tiny_model:
        output:
            directory(config["model"]["path"]),
        log:
            "results/logs/model.log",
        conda:
            "../../environment.yml"
        params:
            cli=FILLEDFIRST,
            shape=tiny_model_args(),
        shell:
            "{params.cli} model tiny {output:q} {params.shape} > {log:q} 2>&1"
