"""`cuda-agent serve`: the command (registered by cuda_agent.cli)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from cuda_agent.console import make_console, print_error

from . import TOKEN_ENV
EXIT_USAGE, EXIT_JUDGE = 2, 3
err = make_console(stderr=True)


def _fail(message: str, code: int = EXIT_JUDGE) -> None:
    print_error(err, message)
    raise typer.Exit(code)


def read_token(token_file: Path | None) -> str:
    """The service token: the file's first line, else $CUDA_AGENT_SERVE_TOKEN. Raises ValueError."""
    if token_file is not None:
        try:
            lines = token_file.read_text().strip().splitlines()
        except OSError as exc:
            raise ValueError(f"{token_file}: {exc.strerror}") from None
        token = lines[0].strip() if lines else ""
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"a token is required: --token-file FILE or ${TOKEN_ENV} "
                         "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    if len(token) < 16:
        raise ValueError("the token must have at least 16 characters")
    return token


def serve_cmd(
    host: Annotated[str, typer.Option("--host", help="address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port")] = 8765,
    token_file: Annotated[Optional[Path], typer.Option(
        "--token-file", help=f"file holding the token clients must send (default: ${TOKEN_ENV})")] = None,
    db: Annotated[Optional[Path], typer.Option(
        "--db", help="results database: verdicts, baselines, the service's queue "
                     "(default: $CUDA_AGENT_DB or results.sqlite in the cache folder)")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="judge workers (cuda: default --judges-per-gpu per visible GPU; cpu: default 1)")] = None,
    judges_per_gpu: Annotated[int, typer.Option(
        "--judges-per-gpu", help="cuda: judge workers sharing each GPU; they check candidates at once and take "
                                 "turns for the timed calls, each alone on the GPU")] = 1,
    compile_workers: Annotated[Optional[int], typer.Option(
        "--compile-workers", help="workers building candidates ahead (default: the spare cores; 0: none)")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="seconds one candidate may hold a judge worker before it is replaced")] = None,
    max_pending: Annotated[int, typer.Option(
        "--max-pending", help="accepted, unfinished submissions before new ones get 429 with Retry-After")] = 1024,
    max_request_mb: Annotated[float, typer.Option(
        "--max-request-mb", help="largest request body accepted, in MiB (413 beyond)")] = 8.0,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray", help="run the judge workers as Ray actors on this cluster ('auto': the running one, "
                      "'local': start one here); needs the ray extra")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cuda or cpu (default: cuda when available)")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="strict or lenient")] = None,
    compile_mode: Annotated[Optional[str], typer.Option(
        "--compile-mode", help="torch.compile mode of the compiled baseline, or none")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="judge settings file (TOML or JSON)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("-c", "--set", help="override a JudgeConfig field")] = None,
) -> None:
    """Serve the judge over HTTP: clients submit (task, candidate) pairs and read verdicts.

    Every route but /v1/health needs 'Authorization: Bearer TOKEN'. Submissions are idempotent
    (a hash of their content), committed before they are acknowledged, and every verdict is
    committed to the results database before any client can read it; a restarted service judges
    again what was in flight. Candidate code runs only in the judge's sandboxed worker processes.
    Exit codes: 2 usage (no token, missing extra, bad setting), 3 the judge could not start.
    """
    from pydantic import ValidationError

    from cuda_agent.db import DBError, default_db_path
    from cuda_agent.judge import JudgeConfig, JudgeError
    from cuda_agent.pool import PoolConfig, PoolError
    from cuda_agent.settings import SettingsError, load

    try:
        token = read_token(token_file)
    except ValueError as exc:
        _fail(str(exc), EXIT_USAGE)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        _fail(f"the service needs its extra: pip install 'cuda-agent[serve]' ({exc})", EXIT_USAGE)
    from .service import JudgeService, ServiceConfig

    try:  # as every command reads the judge's settings: the file, then -c, then the flags
        cfg = load(JudgeConfig, config, set_ or [], section="judge",
                   flags={"device": device, "policy": policy, "compile_mode": compile_mode}, what="judge settings")
    except SettingsError as exc:
        _fail(str(exc), EXIT_USAGE)
    try:
        pool_config = PoolConfig(judge_workers=workers, judges_per_gpu=judges_per_gpu,
                                 compile_workers=compile_workers, time_limit_s=time_limit)
        service_config = ServiceConfig(db=db or default_db_path(cfg.cache_dir), max_pending=max_pending,
                                       max_request_bytes=int(max_request_mb * (1 << 20)))
    except ValidationError as exc:
        _fail(f"invalid settings:\n{exc}", EXIT_USAGE)
    transport = None
    if ray_address is not None:
        try:
            from cuda_agent.pool.ray_transport import RayTransport
        except ImportError as exc:
            _fail(str(exc), EXIT_USAGE)
        transport = RayTransport(None if ray_address == "local" else ray_address)
    try:
        service = JudgeService(cfg, pool_config, service_config, transport=transport)
    except (JudgeError, PoolError, DBError) as exc:
        _fail(str(exc))
    err.print(f"judge service on http://{host}:{port} ({cfg.device}, results in {service_config.db}); "
              f"{service.counters['requeued_at_start']} submissions queued again from the last run")
    uvicorn.run(create_app(service, token), host=host, port=port, log_level="warning",
                timeout_graceful_shutdown=5, limit_concurrency=512)
