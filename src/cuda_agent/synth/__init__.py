"""Task synthesis: operator catalog -> composition -> execution filters -> export.

    catalog.py   seed operators crawled from torch (and transformers when installed)
    compose.py   programmatic composer (deterministic per seed) and LLM composer
    worker.py    the isolated process that runs a candidate's execution checks
    filters.py   worker pool, static filters (duplicates, decontamination) and rejection records
    decontam.py  normalised AST, operator sequence and MinHash similarity to a benchmark
    export.py    Parquet and JSONL with the CUDA-Agent-Ops-6K columns plus our metadata
    pipeline.py  `cuda-agent synth`: parallel, resumable runs and the rejection table
"""
