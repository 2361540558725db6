"""Training: the recipe from the config (``recipe``), the optimizer chain (``optim``), one step
(``step``: the step interface, eager and model-parallel) and its CUDA-graph replay (``graphed``, with the
next batch drawn meanwhile: ``ahead``), the ray budget (``budget``), hybrid data x model parallelism
(``model_parallel``), the builder (``builder``), the trainer (``trainer``), the run loop and its schedule
(``loop``) and evaluation (``evaluate``)."""
