"""The judge as a service: `cuda-agent serve` (app.py, on FastAPI, extra `serve`) and its client
(client.py: `JudgeClient.submit(task, candidate) -> Future[Verdict]`, the pool's API over HTTP).

records.py holds what travels between them; service.py the durable queue in front of the pool.
The client needs only httpx (a dependency of the model client already), not the server's extra.
Nothing is imported here, so that the command line starts without the service's dependencies.
"""

# Where both sides read the service's token by default (the service: `serve --token-file` or this;
# its clients: `JudgeClient.from_env`, behind `bench`/`solve`/`run --judge-url`).
TOKEN_ENV = "CUDA_AGENT_SERVE_TOKEN"
