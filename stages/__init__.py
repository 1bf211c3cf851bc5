"""The pipeline's stages, without Prefect: each a config, a plan of self-describing jobs, ``run(job)`` → rows and a
summary (``stages.contract``), so one runner (``flows.runner``) runs any of them, here or on a cluster."""
