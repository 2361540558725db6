"""Observability: live metrics (``monitor``, ``metrics``), NVML (``nvml``), clocks (``clock``), per-stage
timing (``profiling``), the GPU memory budget and meter (``memory``) and the environment doctor (``doctor``).

Low in the stack (above ``cluster`` only): data, render and training all report through it."""
