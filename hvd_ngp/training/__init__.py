"""Training: the recipe from the config (``recipe``), the optimizer chain (``optim``), one step
(``step``), the ray budget (``budget``), the trainer and its run loop (``trainer``) and evaluation
(``evaluate``)."""
