"""Training: the recipe from the config (``recipe``), the optimizer chain (``optim``), one step
(``step``) and its CUDA-graph replay (``graphed``, with the next batch drawn meanwhile: ``ahead``), the ray
budget (``budget``), hybrid data x model parallelism (``model_parallel``), the trainer and its run loop
(``trainer``) and evaluation (``evaluate``)."""
