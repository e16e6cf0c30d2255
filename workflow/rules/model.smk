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
        shell:
            "{params.cli} model tiny {output:q} > {log:q} 2>&1"
