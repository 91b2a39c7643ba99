"""cuda-agent: agentic RL for CUDA kernel generation, built around an honest, fast judge."""

__version__ = "0.1.0"
