"""`fdecode serve`: an OpenAI-compatible HTTP server over the Engine (docs/serving.md).

    pip install -e ".[serve]"
    fdecode serve [MODEL] [--draft mtp|ngram|DIR] [--port 8000]

- `model.py`: the served step and tokenizer (`load`: a checkpoint folder, or the bundled model);
- `loop.py`: the one thread that owns the Engine, fed through thread-safe queues;
- `schemas.py`, `requests.py`: request bodies, checked and turned into SamplingParams;
- `generation.py`, `stops.py`, `fdecode.detokenize`: events to text, stop strings;
- `responses.py`, `app.py`: OpenAI's bodies and SSE chunks, the FastAPI routes;
- `metrics.py`: Prometheus; `server.py`: start, warm-up, drain; `cli.py`: the command line.
Nothing here is imported by `import fdecode`; it needs the `serve` extra (FastAPI, uvicorn, prometheus-client).
"""

from fdecode.serve.model import ServedModel, load, server_config
from fdecode.serve.server import Server

__all__ = ["ServedModel", "Server", "load", "server_config"]
